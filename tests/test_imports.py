"""Light imports: the schedule API loads without the ML stack; every public name still resolves (lazily)."""

import json
import subprocess
import sys
import textwrap

import pytest

import skiptrain

HEAVY = ("torch", "lightning", "peft", "transformers", "datasets")


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter (this one has already imported torch) and return its stdout."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    "statement",
    ["from skiptrain import SkipDecode, Hierarchical, skipdecode_for_speedup", "import skiptrain.core.schedules"],
)
def test_schedule_api_imports_no_ml_stack(statement):
    out = run_python(f"""
        import json, sys
        {statement}
        import skiptrain
        print(json.dumps({{"loaded": [m for m in {HEAVY!r} if m in sys.modules], "version": skiptrain.__version__}}))
    """)
    result = json.loads(out)
    assert result["loaded"] == [], f"{statement!r} imported {result['loaded']}"
    assert result["version"] == skiptrain.__version__


def test_schedules_work_without_the_ml_stack():
    out = run_python("""
        import sys
        from skiptrain import SkipDecode
        schedule = SkipDecode(max_layers=18, min_layers=5, decay_tokens=32).build(num_layers=24)
        print(round(schedule.sequence_ideal_speedup(32), 2), "torch" in sys.modules)
    """)
    assert out.split() == ["1.97", "False"]


def test_every_public_name_resolves():
    assert len(set(skiptrain.__all__)) == len(skiptrain.__all__)
    assert sorted(skiptrain.__all__) == sorted(skiptrain._LAZY)
    for name in skiptrain.__all__:
        value = getattr(skiptrain, name)
        assert value is not None, name
        assert getattr(value, "__name__", name) == name
        assert name in dir(skiptrain)
    namespace: dict = {}
    exec("from skiptrain import *", namespace)
    assert set(skiptrain.__all__) <= set(namespace)


def test_public_names_are_the_defining_modules_objects():
    from skiptrain.core import schedules
    from skiptrain.export import load as export
    from skiptrain.modeling import forward, generation

    assert skiptrain.SkipDecode is schedules.SkipDecode
    assert skiptrain.skip_forward is forward.skip_forward
    assert skiptrain.generate_under_schedule is generation.generate_under_schedule
    assert skiptrain.load_exported is export.load_exported


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        skiptrain.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        exec("from skiptrain import no_such_name", {})
    assert not hasattr(skiptrain, "no_such_name")


def test_version_is_the_installed_distributions():
    from importlib.metadata import version

    assert skiptrain.__version__ == version("skiptrain")
