"""Every loader, fed generated hostile content: a typed result or one FormatError/ArxtuneError, nothing else.

Valid files are mutated at a random place (a value replaced by a hostile one, a key dropped or added,
the text cut or garbled), so most examples get past the syntax into the checks of content. What a
loader accepts, its readers must then use without an exception (the schema holds what they read).
"""

from __future__ import annotations

import json
import math
import os
import time

from hypothesis import HealthCheck, given, settings, strategies as st

from arxtune.harness.config import from_mapping, load_config
from arxtune.harness.e2e import E2E_VERSION, KIND as E2E_KIND, load_result, report_lines
from arxtune.harness.results import RunMeta, load_run
from arxtune.runtime.errors import ArxtuneError, FormatError
from arxtune.runtime.router import mode_tables
from arxtune.runtime.thresholds import Range, Table, Thresholds, from_dict, load

from helpers.runs import make_run

#: Longest one example may take: a loader that hangs or crawls on hostile input fails here.
EXAMPLE_S = 5.0
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

HOSTILE_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.sampled_from(
        [
            0,
            -1,
            1 << 64,
            10**400,
            1e999,
            -1e999,
            1e-320,
            0.5,
            "",
            "abc",
            "lots",
            "NaN",
            "inf",
            "1e999",
            "../x",
            "\x00",
            "\udcff" if False else "\u00ff",
            "gloo",
            "all_to_all",
            "5",
            [],
            {},
        ]
    ),
    st.floats(allow_nan=False, allow_infinity=True),
    st.text(max_size=12),
)
HOSTILE = st.recursive(
    HOSTILE_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)


def _paths(data, prefix=()):
    """Every (path to a value) in nested dicts/lists, the root included."""
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _paths(value, prefix + (i,))


def _nested(depth: int):
    deep = 1
    for _ in range(depth):
        deep = [deep]  # type: ignore[assignment]
    return deep


@st.composite
def mutated(draw, valid: dict):
    """`valid` with one place changed: a value replaced, a key dropped, an unknown key added, or deep nesting
    (marked as {"__nest__": depth}, built by `realize` so that Hypothesis can still print the example)."""
    data = json.loads(json.dumps(valid))
    paths = list(_paths(data))
    path = draw(st.sampled_from(paths))
    action = draw(st.sampled_from(["replace", "replace", "replace", "drop", "add", "nest"]))
    if not path:
        return draw(HOSTILE) if action == "replace" else data
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if action == "replace":
        parent[key] = draw(HOSTILE)
    elif action == "drop":
        parent.pop(key) if isinstance(parent, dict) else parent.pop(key)
    elif action == "add" and isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=8))] = draw(HOSTILE)
    elif action == "nest":
        parent[key] = {"__nest__": draw(st.sampled_from([20, 200, 5000]))}
    return data


def realize(data):
    """The mutated value with its nesting marker (if any) replaced by the nesting itself."""
    if isinstance(data, dict):
        if set(data) == {"__nest__"} and isinstance(data["__nest__"], int):
            return _nested(data["__nest__"])
        return {k: realize(v) for k, v in data.items()}
    if isinstance(data, list):
        return [realize(v) for v in data]
    return data


def _dumps(data) -> str:
    """JSON text, non-finite floats included (as a hand-edited file might hold them)."""
    try:
        return json.dumps(data)
    except (RecursionError, ValueError):
        return "[" * 5000 + "]" * 5000


def _timed(call):
    start = time.monotonic()
    try:
        return call()
    finally:
        assert time.monotonic() - start < EXAMPLE_S


# -- thresholds (the runtime's loader)


def _valid_thresholds() -> dict:
    table = Table("all_reduce", "float32", 2, (Range(0, 4096, "gloo"), Range(4096, None, "gloo", "model")), "eager", "r", "eager")
    return Thresholds("gloo", 0.05, {"runs": ["r"]}, (table,)).to_dict() | {
        "models": [
            {
                "backend": "gloo",
                "op": "all_reduce",
                "dtype": "float32",
                "world_size": 2,
                "alpha_us": 5.0,
                "bandwidth_gbps": 1.0,
                "mode": "eager",
            }
        ],
        "runs": [
            {"run_id": "r", "fingerprint": {"world_size": 2, "hostnames": ["a", "b"], "device_names": ["cpu", "cpu"], "rdma_devices": None}}
        ],
        "backend_setup": {"gloo": {"options": {}, "capacity": {"all_reduce": 1 << 20}}},
    }


@FUZZ
@given(data=mutated(_valid_thresholds()))
def test_thresholds_from_dict_is_a_file_or_one_format_error(data):
    try:
        data = realize(data)
        result = _timed(lambda: from_dict(data, "fuzz"))
    except FormatError as exc:
        assert "\n" not in str(exc)
        return
    # What the loader accepted, the runtime's readers use without an exception.
    assert all(math.isfinite(m.alpha_us) for m in result.models) and math.isfinite(result.margin)
    mode_tables(result, 2)
    result.to_csv()


#: What an editor may put before a file's text: nothing, a UTF-8 byte-order mark, blanks.
HEADS = st.sampled_from([b"", b"", b"\xef\xbb\xbf", b" \n"])


@FUZZ
@given(data=mutated(_valid_thresholds()), cut=st.integers(min_value=0, max_value=400), junk=st.binary(max_size=8), head=HEADS)
def test_thresholds_files_load_or_fail_in_one_line(tmp_path, data, cut, junk, head):
    text = head + _dumps(realize(data)).encode()
    path = tmp_path / "t.json"
    path.write_bytes(text if cut == 0 else text[:cut] + junk)
    try:
        _timed(lambda: load(path))
    except FormatError as exc:
        assert "\n" not in str(exc)


# -- run meta.json and points.csv


@FUZZ
@given(
    data=mutated(
        {
            "run_id": "r",
            "world_size": 2,
            "device_type": "cpu",
            "config": {"step_factor": 2.0},
            "baseline": "gloo",
            "started": "now",
            "version": 3,
            "finished": "later",
            "hostnames": ["a", "b"],
            "device_names": ["cpu", "cpu"],
            "backends": {
                "gloo": {
                    "available": True,
                    "reason": "",
                    "capturable": False,
                    "ops": ["all_reduce"],
                    "capacity": {"all_reduce": 1024},
                    "options": {},
                }
            },
            "fabric_floor_us": 1.5,
            "rdma_devices": [],
        }
    )
)
def test_run_meta_is_a_meta_or_one_format_error(data):
    try:
        data = realize(data)
        meta = _timed(lambda: RunMeta.from_dict(data, "meta.json"))
    except FormatError as exc:
        assert "\n" not in str(exc)
        return
    assert meta.world_size >= 1 and all(isinstance(s, dict) for s in meta.backends.values())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    line=st.integers(min_value=0, max_value=2),
    column=st.integers(min_value=0, max_value=11),
    value=st.sampled_from(
        ["", "-1", "0", "nan", "inf", "1e999", "9" * 5000, "abc", '"', "a,b", "gloo", "eager", "ok", "1 2 3", "0.5 -1", "\x00", "ünï"]
    ),
)
def test_points_files_load_or_fail_in_one_line(tmp_path_factory, line, column, value):
    run = make_run(tmp_path_factory.mktemp("run"), lambda b, n: 10.0, [1024, 2048], backends=("gloo",), n=10, rounds=2)
    points = run.path / "points.csv"
    lines = points.read_bytes().decode().split("\r\n")
    fields = lines[line].split(",")
    fields[column] = value
    lines[line] = ",".join(fields)
    points.write_bytes("\r\n".join(lines).encode("utf-8", "surrogatepass"))
    try:
        loaded = _timed(lambda: load_run(run.path))
    except FormatError as exc:
        assert "\n" not in str(exc)
        return
    loaded.frame()


# -- sweep config (TOML and the mapping flags feed)

CONFIG_KEYS = [
    "backends",
    "ops",
    "dtypes",
    "views",
    "modes",
    "min_bytes",
    "max_bytes",
    "step_factor",
    "point_budget_s",
    "timeout_s",
    "warmup_iters",
    "rounds",
    "min_iters",
    "max_iters",
    "baseline",
    "out",
    "backend_options",
    "colour",
]


@FUZZ
@given(data=st.dictionaries(st.sampled_from(CONFIG_KEYS), HOSTILE, max_size=4))
def test_sweep_config_is_a_config_or_one_error(data):
    try:
        config = _timed(lambda: from_mapping(data))
    except ArxtuneError:  # the CLI prints it as one line; anything else would be a traceback
        return
    assert config.min_bytes <= config.max_bytes and config.step_factor > 1 and config.views


TOML_VALUES = st.sampled_from(
    [
        "1e999",
        "nan",
        "-inf",
        "0",
        "-1",
        "1",
        "9" * 5000,
        '"abc"',
        '"1MiB"',
        '"9999999999999999999999TiB"',
        '"' + "9" * 5000 + '"',
        '"99999999999GiB"',
        "[]",
        '["gloo"]',
        "[1, 2]",
        "{}",
        "{arx = 3}",
        "{arx = {max_bytes = \"lots\"}}",
        "true",
        "[" * 2000 + "]" * 2000,
        '"\\u0000"',
    ]
)


@FUZZ
@given(
    pairs=st.lists(st.tuples(st.sampled_from(CONFIG_KEYS), TOML_VALUES), max_size=3),
    raw=st.binary(max_size=20),
    head=HEADS,
    table=st.booleans(),
)
def test_sweep_config_files_load_or_fail_in_one_line(tmp_path, pairs, raw, head, table):
    path = tmp_path / "c.toml"
    body = ("[sweep]\n" if table else "") + "".join(f"{k} = {v}\n" for k, v in dict(pairs).items())
    path.write_bytes(head + body.encode() + raw)
    try:
        _timed(lambda: load_config(path))
    except ArxtuneError:
        pass


# -- e2e result


def _valid_e2e() -> dict:
    stats = {"median_us": 1000.0, "ci_low_us": 900.0, "ci_high_us": 1100.0}
    return {
        "kind": E2E_KIND,
        "version": E2E_VERSION,
        "config": {},
        "summary": {
            "vllm": {"decode": stats, "prefill": stats, "calls": {}, "plugin": False, "tokens_identical": True},
            "thresholds": {"decode": stats, "prefill": stats, "calls": {"0": {"gloo": 3}}, "plugin": True, "tokens_identical": True},
        },
        "ratio_vs_vllm": {"thresholds": {"median": 1.0, "low": 0.9, "high": 1.1}},
    }


@FUZZ
@given(data=mutated(_valid_e2e()))
def test_e2e_results_load_and_report_or_fail_in_one_line(tmp_path, data):
    path = tmp_path / "e2e.json"
    path.write_text(_dumps(realize(data)))
    try:
        result = _timed(lambda: load_result(path))
    except FormatError as exc:
        assert "\n" not in str(exc)
        return
    report_lines(result)
