"""The frontend's workers: the pool (health, load, prefix-aware routing), one link per worker and the
Session stream each link holds."""
