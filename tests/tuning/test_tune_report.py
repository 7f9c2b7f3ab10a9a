"""The result files have exactly the seed's fields (seeds/002: AOE's OPAT and SGAT result files)."""

from __future__ import annotations

import json
import re

from airgraph.tuning.report import (
    BASIC_FIELDS,
    OPAT_FIELDS,
    SGAT_FIELDS,
    SUMMARY_FIELDS,
    Outcome,
    TuneReport,
    improvement,
)
from tests.tuning.seed_format import SEED_BASIC, SEED_OPAT, SEED_SGAT, SEED_SUMMARY, validate


def test_the_modules_field_lists_are_the_seeds():
    assert set(BASIC_FIELDS) == SEED_BASIC and set(SUMMARY_FIELDS) == SEED_SUMMARY
    assert set(OPAT_FIELDS) == SEED_OPAT and set(SGAT_FIELDS) == SEED_SGAT


def test_improvement_is_before_over_after_minus_one():
    assert improvement(58.781, 26.876) == "118.71%"  # the seed's own example
    assert improvement(5.58434, 3.573203) == "56.28%"


def test_an_operator_report_while_running_after_success_and_after_failure(tmp_path):
    report = TuneReport("op", tmp_path)
    assert re.fullmatch(r"aoe_result_opat_\d{17}_\d+\.json", report.path.name)
    task = report.new_task("Model graph 0 (inference)")
    running = json.loads(report.path.read_text())
    validate(running, "op")
    assert next(iter(running.values())) == [{"basic": {"tuning_name": "Model graph 0 (inference)"}}]  # no ops yet
    task.outcomes.append(Outcome("mlp.0/addmm", "addmm", "k1", "add", "onednn-packed", "Impl", 58.781, 26.876))
    task.outcomes.append(Outcome("mlp.2/addmm_1", "addmm", "k2", "hit", "onednn-packed", "Impl", 10.0, 5.0))
    task.outcomes.append(Outcome("mlp.4/mm", "mm", "k3", "update", "template", "Schedule", 16.71, 15.71))
    task.outcomes.append(Outcome("attn/sdpa", "sdpa", "k4", "unsatisfied"))
    report.write()
    incomplete = json.loads(report.path.read_text())
    validate(incomplete, "op")
    body = next(iter(incomplete.values()))[1]["OPAT"]
    assert body["opat_tuning_result"] == "tuning incomplete"
    assert "tuning_time(s)" not in next(iter(incomplete.values()))[0]["basic"]  # the seed: not while interrupted
    task.status, task.seconds = "tuning successful", 4.25
    report.write()
    done = json.loads(report.path.read_text())
    validate(done, "op")
    basic, opat = done[task.key][0]["basic"], done[task.key][1]["OPAT"]
    assert basic["tuning_time(s)"] == 4.25 and opat["opat_tuning_result"] == "tuning successful"
    assert [op["op_name"] for op in opat["repo_modified_operators"]] == ["mlp.0/addmm", "mlp.4/mm"]
    first = opat["repo_modified_operators"][0]["tune_performance"]["Impl"]
    assert first == {
        "performance_after_tune(us)": 26.876,
        "performance_before_tune(us)": 58.781,
        "performance_improvement": "118.71%",
        "update_mode": "add",
    }
    assert opat["repo_summary"] == {
        "repo_add_num": 1,
        "repo_hit_num": 2,
        "repo_reserved_num": 1,
        "repo_unsatisfied_num": 1,
        "repo_update_num": 1,
        "total_num": 4,
    }
    task.outcomes.append(Outcome("res4a_branch1", "convolution", "k5", "failed"))
    task.status = "tuning failed"
    report.write()
    failed = json.loads(report.path.read_text())
    validate(failed, "op")
    assert failed[task.key][1]["OPAT"]["tuning_failed_operators"] == ["res4a_branch1"]
    assert failed[task.key][1]["OPAT"]["opat_tuning_result"] == "tuning failed"


def test_a_subgraph_report_and_its_sections(tmp_path):
    report = TuneReport("subgraph", tmp_path)
    assert report.path.name.startswith("aoe_result_sgat_")
    task = report.new_task("Model graph 0 (inference)")
    task.outcomes.append(
        Outcome("graph 0 segment 0", "segment", "key-a", "add", "inductor", "Subgraph", 5584.34, 3573.203)
    )
    task.outcomes.append(Outcome("graph 0 segment 1", "segment", "key-b", "unsatisfied"))
    task.model_before_ms, task.model_after_ms, task.seconds = 5.600486, 3.610442, 19.0
    report.write()
    document = json.loads(report.path.read_text())
    validate(document, "subgraph")
    sgat = document[task.key][1]["SGAT"]
    assert sgat["model_baseline_performance(ms)"] == 5.600486 and sgat["model_result_performance(ms)"] == 3.610442
    assert sgat["repo_modified_subgraphs"]["add_repo_subgraphs"] == [
        {
            "performance_after_tune(ms)": 3.573203,
            "performance_before_tune(ms)": 5.58434,
            "performance_improvement": "56.28%",
            "repo_key": "key-a",
        }
    ]
    assert sgat["repo_modified_subgraphs"]["update_repo_subgraphs"] == []
    second = report.new_task("Model graph 1 (inference)")  # a file holds several tasks
    second.failed_section = True  # subgraph tuning failed: the seed has no SGAT section then
    report.write()
    document = json.loads(report.path.read_text())
    validate(document, "subgraph")
    assert list(document) == [task.key, second.key] and len(document[second.key]) == 1
