"""arxtune's NCCL tuner plugin, compiled here and driven through ctypes the way NCCL drives it (no GPU needed):
init with a logger, getCollInfo with a cost table float[algorithms][protocols], and NCCL's own pick afterwards
(the cheapest usable entry). Also the export from a calibrated run back through the plugin."""

from __future__ import annotations

import ctypes
import shutil

import pytest
from typer.testing import CliRunner

from arxtune.cli import app
from arxtune.harness.calibrate import calibrate
from arxtune.runtime import nccl_tuner
from arxtune.runtime.backends import split_name
from arxtune.runtime.backends.nccl_variant import ALGORITHMS, PROTOCOLS, NcclVariant
from arxtune.runtime.errors import ArxtuneError
from helpers.runs import make_run

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler here")

c_int, c_size_t, c_void_p, c_float = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_float
# NCCL's logger is variadic; the plugin always calls it as (level, flags, file, line, "%s", text).
LOGGER = ctypes.CFUNCTYPE(None, c_int, ctypes.c_ulong, ctypes.c_char_p, c_int, ctypes.c_char_p, ctypes.c_char_p)
COLL_INFO = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_size_t, c_int, ctypes.POINTER(c_float), c_int, c_int, c_int, ctypes.POINTER(c_int))
COLL_INFO_V3 = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_size_t, c_int, ctypes.POINTER(c_float), c_int, c_int, ctypes.POINTER(c_int))
INIT_V4 = ctypes.CFUNCTYPE(c_int, c_size_t, c_size_t, LOGGER, ctypes.POINTER(c_void_p))
INIT_V5 = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(c_void_p), ctypes.c_uint64, c_size_t, c_size_t, LOGGER, c_void_p, c_void_p)
FINALIZE = ctypes.CFUNCTYPE(c_int, c_void_p)
CHUNK = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_size_t, c_int, c_int, c_int, ctypes.POINTER(c_size_t))


class TunerV3(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", INIT_V4), ("getCollInfo", COLL_INFO_V3), ("destroy", FINALIZE)]


class TunerV4(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", INIT_V4), ("getCollInfo", COLL_INFO), ("destroy", FINALIZE)]


class TunerV5(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", INIT_V5), ("getCollInfo", COLL_INFO), ("finalize", FINALIZE)]


class TunerV6(ctypes.Structure):
    _fields_ = TunerV5._fields_ + [("getChunkSize", CHUNK)]


COLL = {"broadcast": 0, "reduce": 1, "allgather": 2, "reducescatter": 3, "allreduce": 4}  # ncclFunc_t
A = {name.lower(): i for i, name in enumerate(ALGORITHMS)}
P = {name.lower(): i for i, name in enumerate(PROTOCOLS)}
IGNORE = -1.0
WARN, INFO = 2, 3


def nccl_costs(algos=7, protos=3, ignored=("collnetdirect", "collnetchain", "nvls", "nvlstree")):
    """A cost table as NCCL fills it: distinct positive times, -1 where an algorithm cannot run here."""
    return [[IGNORE if ALGORITHMS[a].lower() in ignored else 10.0 + 3 * a + p for p in range(protos)] for a in range(algos)]


class FakeNccl:
    """Loads the plugin the way NCCL does (dlsym of one versioned symbol) and asks it per call."""

    def __init__(self, library: str, version: int = 5):
        self.lib = ctypes.CDLL(library)
        kind = {3: TunerV3, 4: TunerV4, 5: TunerV5, 6: TunerV6, 7: TunerV6}[version]
        self.plugin = kind.in_dll(self.lib, f"ncclTunerPlugin_v{version}")
        self.version = version
        self.logs: list[tuple[int, str]] = []
        self._logger = LOGGER(lambda level, flags, file, line, fmt, text: self.logs.append((level, text.decode())))
        self.context = c_void_p()

    def open(self, ranks: int = 2, nodes: int = 1) -> "FakeNccl":
        if self.version <= 4:
            rc = self.plugin.init(ranks, nodes, self._logger, ctypes.byref(self.context))
        else:
            rc = self.plugin.init(ctypes.byref(self.context), 1234, ranks, nodes, self._logger, None, None)
        assert rc == 0
        return self

    def close(self) -> None:
        assert (self.plugin.destroy if self.version <= 4 else self.plugin.finalize)(self.context) == 0

    def ask(self, collective: str, nbytes: int, costs=None, pipe_ops: int = 1, reg_buff: int = 0):
        """(entries the plugin zeroed, NCCL's pick afterwards, the channel count it set; 0 = NCCL's)."""
        costs = costs or nccl_costs()
        algos, protos = len(costs), len(costs[0])
        table = (c_float * (algos * protos))(*[c for row in costs for c in row])
        channels = c_int(0)
        if self.version == 3:  # no regBuff: NCCL 2.22
            rc = self.plugin.getCollInfo(self.context, COLL[collective], nbytes, pipe_ops, table, algos, protos, ctypes.byref(channels))
        else:
            rc = self.plugin.getCollInfo(
                self.context, COLL[collective], nbytes, pipe_ops, table, algos, protos, reg_buff, ctypes.byref(channels)
            )
        assert rc == 0
        after = [[table[a * protos + p] for p in range(protos)] for a in range(algos)]
        zeroed = {(ALGORITHMS[a].lower(), PROTOCOLS[p].lower()) for a in range(algos) for p in range(protos) if after[a][p] != costs[a][p]}
        usable = [(after[a][p], a, p) for a in range(algos) for p in range(protos) if after[a][p] >= 0]
        _, a, p = min(usable)
        return zeroed, (ALGORITHMS[a].lower(), PROTOCOLS[p].lower()), channels.value

    def warnings(self) -> list[str]:
        return [text for level, text in self.logs if level == WARN]


@pytest.fixture
def plugin_path(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    return str(nccl_tuner.build())


@pytest.fixture
def tuner(plugin_path, tmp_path, monkeypatch):
    """tuner(csv_text, version=5, ranks=2, nodes=1) -> an opened FakeNccl reading that file."""
    opened = []

    def make(text: str, version: int = 5, ranks: int = 2, nodes: int = 1) -> FakeNccl:
        path = tmp_path / f"policy-{len(opened)}.csv"
        path.write_text(text)
        monkeypatch.setenv(nccl_tuner.CONFIG_ENV, str(path))
        fake = FakeNccl(plugin_path, version).open(ranks, nodes)
        opened.append(fake)
        return fake

    yield make
    for fake in opened:
        fake.close()


NCCL_DEFAULT = ("tree", "ll")  # the cheapest usable entry of nccl_costs(): what NCCL picks by itself
TWO_RANGES = """# small all-reduces on LL with 4 channels, large ones on Simple
allreduce,0,65535,ring,ll,4,-1,-1,-1,-1
allreduce,65536,-1,tree,simple,-1,-1,-1,-1,-1
"""


@pytest.mark.parametrize("version", [3, 4, 5, 6, 7])
def test_every_exported_interface_version_picks_per_range_and_leaves_the_rest_to_nccl(tuner, version):
    t = tuner(TWO_RANGES, version=version)
    assert t.plugin.name == b"arxtune"
    for size in (1, 4096, 65535):
        assert t.ask("allreduce", size) == ({("ring", "ll")}, ("ring", "ll"), 4)
    for size in (65536, 1 << 20, 1 << 40):
        assert t.ask("allreduce", size) == ({("tree", "simple")}, ("tree", "simple"), 0)
    assert t.ask("allgather", 4096) == (set(), NCCL_DEFAULT, 0)  # no rule: NCCL's choice, table untouched
    assert not t.warnings()


def test_v3_calls_without_registration_apply_only_rules_that_match_either(tuner):
    t = tuner("allreduce,0,-1,ring,ll,2,-1,-1,-1,1\nallreduce,0,-1,tree,simple,3,-1,-1,-1,-1\n", version=3)
    assert t.ask("allreduce", 64) == ({("tree", "simple")}, ("tree", "simple"), 3)


def test_the_chunk_size_hook_of_v6_keeps_nccls_size(tuner):
    t = tuner(TWO_RANGES, version=6)
    size = c_size_t(131072)
    assert t.plugin.getChunkSize(t.context, COLL["allreduce"], 1 << 20, A["ring"], P["simple"], 4, ctypes.byref(size)) == 0
    assert size.value == 131072


def test_overlapping_ranges_first_match_wins(tuner):
    t = tuner("allreduce,0,1000,ring,simple,2,-1,-1\nallreduce,500,2000,tree,ll,8,-1,-1\n")
    assert t.ask("allreduce", 700) == ({("ring", "simple")}, ("ring", "simple"), 2)
    assert t.ask("allreduce", 1500) == ({("tree", "ll")}, ("tree", "ll"), 8)


def test_wildcards_and_exact_matches_of_nodes_ranks_pipe_ops_and_registration(tuner):
    t = tuner(
        "allreduce,0,-1,tree,simple,-1,2,-1\n"  # two nodes only: not this group
        "allreduce,0,-1,tree,ll128,-1,-1,8\n"  # eight ranks only: not this group
        "allreduce,0,-1,ring,ll128,3,-1,-1,4\n"  # four ops in the group only
        "allreduce,0,-1,tree,ll,5,-1,-1,-1,1\n"  # registered buffers only
        "allreduce,0,-1,-1,simple,-1,1,2,-1,-1\n"  # this group; the algorithm is NCCL's to pick
        "reducescatter,0,-1,-1,-1,6,-1,-1\n",  # channels alone
        ranks=2,
        nodes=1,
    )
    assert t.ask("allreduce", 64, pipe_ops=4) == ({("ring", "ll128")}, ("ring", "ll128"), 3)
    assert t.ask("allreduce", 64, reg_buff=1) == ({("tree", "ll")}, ("tree", "ll"), 5)
    # protocol fixed, algorithm left to NCCL: the cheapest usable algorithm with Simple (Tree here, but...)
    costs = nccl_costs()
    costs[A["pat"]][P["simple"]] = 1.0  # ...PAT with Simple is cheaper still
    assert t.ask("allreduce", 64, costs) == ({("pat", "simple")}, ("pat", "simple"), 0)
    assert t.ask("reducescatter", 64) == (set(), NCCL_DEFAULT, 6)
    assert t.ask("allgather", 64) == (set(), NCCL_DEFAULT, 0)


def test_names_are_read_in_either_spelling_and_any_case(tuner):
    t = tuner("AllReduce,0,-1,NVLS_Tree,LL128,-1,-1,-1\nall_gather,0,-1,CollNetDirect,Simple,-1,-1,-1\n")
    costs = [[10.0 + a + p for p in range(3)] for a in range(7)]  # everything usable
    assert t.ask("allreduce", 8, costs)[1] == ("nvlstree", "ll128")
    assert t.ask("allgather", 8, costs)[1] == ("collnetdirect", "simple")


def test_a_choice_nccl_cannot_make_here_keeps_nccls_and_is_said_once(tuner):
    t = tuner("allreduce,0,-1,nvls,simple,4,-1,-1\nallgather,0,-1,pat,ll,-1,-1,-1\n")
    for _ in range(3):
        assert t.ask("allreduce", 4096) == (set(), NCCL_DEFAULT, 0)  # NVLS is ignored in this table
    said = [text for level, text in t.logs if "does not offer" in text]
    assert len(said) == 1 and "nvls/simple" in said[0] and ":1 " in said[0]
    six = nccl_costs(algos=6)  # an NCCL without PAT
    assert t.ask("allgather", 4096, six) == (set(), NCCL_DEFAULT, 0)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("allreduce,0,-1,ring,ll256,-1,-1,-1\n", "unknown protocol"),
        ("allreduce,0,-1,spiral,ll,-1,-1,-1\n", "unknown algorithm"),
        ("alltoall,0,-1,ring,ll,-1,-1,-1\n", "unknown collective"),
        ("allreduce,0,-1,ring,ll\n", "fewer than 8 fields"),
        ("allreduce,zero,-1,ring,ll,-1,-1,-1\n", "min_bytes"),
        ("allreduce,100,10,ring,ll,-1,-1,-1\n", "below min_bytes"),
        ("allreduce,0,-1,ring,ll,65,-1,-1\n", "channels"),
        ("allreduce,0,-1,ring,ll,-1,-1,-1,-1,2\n", "regBuff"),
        ("allreduce,0,-1,ring,ll,-1,-1,-1,-1,-1,7\n", "more than 10 fields"),
        ("allreduce,0,-1,ring,ll,-1,-1,-1\n" + "x" * 600 + "\n", "longer than"),
        ("allreduce,0,-1,ring,ll,-1,-1,-1\n\0\n", "NUL"),
    ],
)
def test_a_file_with_any_bad_line_is_dropped_whole_with_one_warning(tuner, text, problem):
    good = "allgather,0,-1,tree,simple,2,-1,-1\n"  # a good rule before the bad one is dropped too
    t = tuner(good + text)
    assert t.ask("allreduce", 64) == (set(), NCCL_DEFAULT, 0)
    assert t.ask("allgather", 64) == (set(), NCCL_DEFAULT, 0)
    warnings = t.warnings()
    assert len(warnings) == 1 and problem in warnings[0] and "NCCL chooses every call" in warnings[0], warnings


def test_a_missing_file_or_no_file_named_leaves_every_call_to_nccl(plugin_path, tmp_path, monkeypatch):
    for value in (str(tmp_path / "absent.csv"), None):
        if value is None:
            monkeypatch.delenv(nccl_tuner.CONFIG_ENV, raising=False)
        else:
            monkeypatch.setenv(nccl_tuner.CONFIG_ENV, value)
        t = FakeNccl(plugin_path).open()
        assert t.ask("allreduce", 64) == (set(), NCCL_DEFAULT, 0)
        expected = "cannot open" if value else f"{nccl_tuner.CONFIG_ENV} is not set"
        assert len(t.warnings()) == 1 and expected in t.warnings()[0], t.warnings()
        t.close()


def test_applied_choices_are_logged_for_nccl_debug_tuning(tuner):
    t = tuner(TWO_RANGES)
    t.ask("allreduce", 4096)
    assert any(level == INFO and "allreduce 4096 bytes -> ring/ll, 4 channels" in text for level, text in t.logs), t.logs


def test_the_protocol_and_algorithm_a_communicator_is_created_under_are_said_at_init(tuner, monkeypatch):
    # NCCL calls init while it creates the communicator, one step before its tuning model reads these
    for name in ("NCCL_PROTO", "NCCL_ALGO"):
        monkeypatch.delenv(name, raising=False)
    assert not any("created with" in text for _, text in tuner(TWO_RANGES).logs)
    monkeypatch.setenv("NCCL_PROTO", "LL")
    said = [text for level, text in tuner(TWO_RANGES, ranks=1).logs if level == INFO and "created with" in text]
    assert said == ["arxtune tuner: communicator of 1 ranks created with NCCL_PROTO=LL NCCL_ALGO=(unset)"]
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    assert any(text.endswith("NCCL_PROTO=LL NCCL_ALGO=Ring") for _, text in tuner(TWO_RANGES).logs)


def test_no_compiler_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(ArxtuneError, match="cannot build the NCCL tuner plugin"):
        nccl_tuner.build()


# -- the export: a calibrated run with variant rows, written for the plugin and read back

VARIANTS = ("nccl", "nccl[proto=LL,channels=4]", "nccl[proto=Simple,algo=Ring]", "nccl[proto=LL128]")
SIZES = [1 << k for k in range(10, 25)]


def _latency(backend, nbytes):
    """LL with 4 channels wins small sizes, Ring/Simple large ones, NCCL's own choice the middle; LL128 never."""
    if backend == "nccl[proto=LL,channels=4]":
        return 5 + nbytes / 2e3
    if backend == "nccl[proto=Simple,algo=Ring]":
        return 60 + nbytes / 2e4
    if backend == "nccl[proto=LL128]":
        return 80 + nbytes / 1e3
    return 30 + nbytes / 1e4


@pytest.fixture
def variant_run(tmp_path):
    return make_run(tmp_path / "runs", _latency, SIZES, backends=VARIANTS, dtypes=("bfloat16", "float32"), ops=("all_reduce", "all_gather"))


def _expected(backend: str):
    """What the plugin should do for a size the thresholds give to `backend`: (zeroed entries, pick, channels)."""
    base, settings = split_name(backend)
    if not settings:
        return set(), NCCL_DEFAULT, 0
    v = NcclVariant.parse(settings)
    costs = nccl_costs()
    usable = [
        (costs[a][p], a, p)
        for a in range(7)
        for p in range(3)
        if costs[a][p] >= 0 and (v.algo is None or ALGORITHMS[a] == v.algo) and (v.proto is None or PROTOCOLS[p] == v.proto)
    ]
    _, a, p = min(usable)
    pick = (ALGORITHMS[a].lower(), PROTOCOLS[p].lower())
    return {pick}, pick, v.channels or 0


def test_the_export_round_trips_every_choice_of_the_calibration(variant_run, tuner):
    thresholds = calibrate(variant_run, baseline="nccl")
    export = nccl_tuner.tuner_csv(thresholds)
    assert export.dtypes == {("all_gather", 2): "bfloat16", ("all_reduce", 2): "bfloat16"}
    won = {r.backend for t in thresholds.tables for r in t.ranges}
    assert {"nccl", "nccl[proto=LL,channels=4]", "nccl[proto=Simple,algo=Ring]"} <= won and "nccl[proto=LL128]" not in won
    t = tuner(export.text, ranks=2, nodes=2)  # make_run's two ranks sit on hosts a and b
    assert not t.warnings()
    checked = 0
    for table in thresholds.tables:
        if table.dtype != "bfloat16":
            continue
        collective = nccl_tuner.COLLECTIVES[table.op]
        for r in table.ranges:
            for size in {r.lo, r.lo + 1, (r.hi or r.lo * 4 + 8) - 1}:
                assert t.ask(collective, size) == _expected(r.backend), (table.op, size, r)
                checked += 1
    assert checked > 10
    variant_runs = 0
    for table in thresholds.tables:  # neighbouring ranges of one variant (measured, then model) make one rule
        names = [r.backend for r in table.ranges]
        variant_runs += (
            sum(1 for i, n in enumerate(names) if n != "nccl" and (i == 0 or names[i - 1] != n)) if table.dtype == "bfloat16" else 0
        )
    assert export.rules == variant_runs


def test_the_export_writes_the_example_plugins_ten_columns(variant_run):
    export = nccl_tuner.tuner_csv(calibrate(variant_run, baseline="nccl"), dtype="float32")
    rules = [line.split(",") for line in export.text.splitlines() if not line.startswith("#")]
    assert rules and all(len(r) == 10 for r in rules)
    assert rules[0] == ["allgather", "0", rules[0][2], "-1", "LL", "4", "2", "2", "-1", "-1"]
    assert "# " + ",".join(nccl_tuner.COLUMNS) in export.text.splitlines()
    with pytest.raises(ArxtuneError, match="no int32 table"):
        nccl_tuner.tuner_csv(calibrate(variant_run, baseline="nccl"), dtype="int32")
    with pytest.raises(ArxtuneError, match="no graph tables"):
        nccl_tuner.tuner_csv(calibrate(variant_run, baseline="nccl"), mode="graph")


def test_calibrate_export_nccl_tuner_writes_the_file_beside_the_thresholds(variant_run, tuner):
    result = CliRunner().invoke(app, ["calibrate", str(variant_run.path), "--baseline", "nccl", "--export", "nccl-tuner"])
    assert result.exit_code == 0, result.output
    target = variant_run.path / "nccl-tuner.csv"
    assert f"nccl tuner: {target}" in result.output and "NCCL_TUNER_PLUGIN=" in result.output
    t = tuner(target.read_text(), nodes=2)
    assert t.ask("allreduce", 1024) == ({("tree", "ll")}, ("tree", "ll"), 4)  # LL, the algorithm left to NCCL
    again = CliRunner().invoke(
        app, ["nccl-tuner", "export", str(variant_run.path / "thresholds.json"), "--out", str(variant_run.path / "again.csv")]
    )
    assert again.exit_code == 0, again.output
    assert (variant_run.path / "again.csv").read_text() == target.read_text()


def test_nccl_tuner_build_prints_the_library_path(plugin_path):
    result = CliRunner().invoke(app, ["nccl-tuner", "build"])
    assert result.exit_code == 0 and result.output.strip() == plugin_path
