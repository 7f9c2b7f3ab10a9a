"""The seed's result-file fields (seeds/002: AOE's OPAT and SGAT result files), written out here from the seed's
tables (not imported from airgraph), and a validator every tuning test runs on the files it gets."""

from __future__ import annotations

import re

# The seed's field lists, written out here from the seed's tables (not imported), so a change to report.py that
# drifts from the seed fails.
SEED_BASIC = {"tuning_name", "tuning_time(s)"}
SEED_SUMMARY = {
    "repo_add_num",
    "repo_hit_num",
    "repo_reserved_num",
    "repo_unsatisfied_num",
    "repo_update_num",
    "total_num",
}
SEED_OPAT = {"opat_tuning_result", "repo_modified_operators", "repo_summary"}
SEED_OPERATOR = {"op_name", "op_type", "tune_performance"}
SEED_PERFORMANCE_US = {
    "performance_after_tune(us)",
    "performance_before_tune(us)",
    "performance_improvement",
    "update_mode",
}
SEED_SGAT = {
    "model_baseline_performance(ms)",
    "model_performance_improvement",
    "model_result_performance(ms)",
    "repo_modified_subgraphs",
    "repo_summary",
}
SEED_SUBGRAPH = {"performance_after_tune(ms)", "performance_before_tune(ms)", "performance_improvement", "repo_key"}


def validate(document: dict, mode: str) -> None:
    """Check a result file against the seed's field list, every field and its type."""
    assert document, "a result file holds at least one task"
    for name, task in document.items():
        assert re.fullmatch(r"report_\d{17}_\d+_*", name), name
        assert isinstance(task, list) and 1 <= len(task) <= 2
        basic = task[0]["basic"]
        assert set(task[0]) == {"basic"} and set(basic) <= SEED_BASIC and "tuning_name" in basic
        assert isinstance(basic["tuning_name"], str)
        assert isinstance(basic.get("tuning_time(s)", 0), (int, float))
        if len(task) == 1:
            continue
        section = task[1]
        if mode == "op":
            body = section["OPAT"]
            assert set(section) == {"OPAT"}
            result = body["opat_tuning_result"]
            assert result in ("tuning successful", "tuning failed", "tuning incomplete")
            assert set(body) == SEED_OPAT | ({"tuning_failed_operators"} if result == "tuning failed" else set())
            if result == "tuning failed":
                assert all(isinstance(n, str) for n in body["tuning_failed_operators"])
            for op in body["repo_modified_operators"]:
                assert set(op) == SEED_OPERATOR and isinstance(op["op_name"], str) and isinstance(op["op_type"], str)
                (mode_name, perf), *rest = op["tune_performance"].items()
                assert not rest and mode_name in ("Impl", "Format", "Schedule")
                assert set(perf) == SEED_PERFORMANCE_US and perf["update_mode"] in ("add", "update")
                _check_improvement(perf, "us")
        else:
            body = section["SGAT"]
            assert set(section) == {"SGAT"} and set(body) == SEED_SGAT
            assert set(body["repo_modified_subgraphs"]) == {"add_repo_subgraphs", "update_repo_subgraphs"}
            for subgraphs in body["repo_modified_subgraphs"].values():
                for sub in subgraphs:
                    assert set(sub) == SEED_SUBGRAPH and isinstance(sub["repo_key"], str)
                    _check_improvement(sub, "ms")
            model = {
                "performance_before_tune(ms)": body["model_baseline_performance(ms)"],
                "performance_after_tune(ms)": body["model_result_performance(ms)"],
                "performance_improvement": body["model_performance_improvement"],
            }
            _check_improvement(model, "ms")
        summary = body["repo_summary"]
        assert set(summary) == SEED_SUMMARY and all(isinstance(v, int) and v >= 0 for v in summary.values())
        assert summary["total_num"] == sum(
            summary[k] for k in ("repo_add_num", "repo_update_num", "repo_reserved_num", "repo_unsatisfied_num")
        )
        assert summary["repo_hit_num"] >= summary["repo_update_num"]


def _check_improvement(perf: dict, unit: str) -> None:
    before, after = perf[f"performance_before_tune({unit})"], perf[f"performance_after_tune({unit})"]
    assert isinstance(before, (int, float)) and isinstance(after, (int, float))
    assert re.fullmatch(r"-?\d+\.\d\d%", perf["performance_improvement"])
    if after > 0:
        assert abs(float(perf["performance_improvement"][:-1]) - (before / after - 1) * 100) < 0.02
