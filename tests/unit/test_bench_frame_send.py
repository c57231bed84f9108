"""benchmarks.frame_send runs each case end to end (a reader process, every frame delivered before
the writer closes) and prints a JSON line per case and round."""

import json

from nanoserve.benchmarks import frame_send


def test_each_case_runs_and_prints_its_figures(capsys) -> None:
    frame_send.main(["--steps", "20", "--ops", "5", "--rounds", "1"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["case"] for r in rows] == list(frame_send.CASES)
    for row in rows:
        assert 0 < row["step_us_median"] <= row["step_us_mean"] * 10
