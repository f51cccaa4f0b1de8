"""The seed's own tests, run unchanged against our model."""

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SEED_TEXT = HERE.parent.parent / "shared" / "seed" / "decode_scheduling_seed_zh.txt"
COPY = HERE / "seed" / "seed_tests.py"


def _load():
    spec = importlib.util.spec_from_file_location("seed_tests", COPY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SEED = _load()
NAMES = [
    "test_enqueue_contract",
    "test_schedule_key_decision_order",
    "test_wait_steps_is_observation_not_priority",
    "test_aging_changes_effective_priority",
    "test_capacity_admission_and_release",
    "test_preemption_and_resume_preserve_progress",
    "test_non_preemptible_and_deadline_policy",
    "test_state_progression_and_completion",
    "test_input_guards_and_step_limit",
]


@pytest.mark.parametrize("name", NAMES)
def test_seed_function_passes(name):
    getattr(SEED, name)()


def test_seed_runner_passes(capsys):
    SEED.test_decode_scheduler()
    assert "机制测试通过" in capsys.readouterr().out


@pytest.mark.skipif(not SEED_TEXT.exists(), reason="shared/seed is not beside this checkout")
def test_copy_matches_the_seed_text():
    seed = SEED_TEXT.read_text(encoding="utf-8")
    body = COPY.read_text(encoding="utf-8")
    tests = body[body.index("# 机制测试"):].rstrip("\n")
    assert tests in seed
    assert len([n for n in NAMES if f"def {n}(" in tests]) == 9
