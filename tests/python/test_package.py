"""CPU tests of the Python package (python/flashoverlap): what runs without a
GPU. ctest runs them as cpu.python_package (tests/python/CMakeLists.txt),
with FLASHOVERLAP_LIBRARY naming the build's library; by hand:

    FLASHOVERLAP_LIBRARY=build/src/api/libflashoverlap.so python3 -m unittest discover -s tests/python -v

They check that importing the package imports no torch and loads nothing,
that torch imports before and after it, the ctypes layer (every function of
flashoverlap_c.h declared with the header's arity, the versions, NULL
handles -> InvalidArgument with the C message, no GPU -> NoGpu, the ops'
options structs, GemmReduceScatter's paths and layouts, all_gather_rows'
prototype and what the ctypes method passes, GemmAllToAll's options, paths,
prototypes, fo_alltoall_routing and what its ctypes methods pass), ReduceScatter's
rows (flashoverlap.torch.rs_rows/rs_rows_out, what the fake implementations
allocate by), the NCCL check (a stand-in libnccl.so.2 of 2.27 loaded first, as
torch loads its own: named at load, refused at a communicator's
construction), the wheel the build backend writes, and,
where torch is importable (Debian's 1.13 serves), the tensor validation's
messages (all_gather_rows' too: its default m, its refusals before any work)
and the "needs PyTorch >= 2.4" refusal; GemmAllToAll's argument checks
(check_a2a_inputs, the counts, the routing's copy to the host and what a
call hands the library, before any GPU work), with several experts per rank
too (the 3-D weight, expert_counts in each form, the constructor's experts
and topk, the custom ops' optional argument and fakes, the planning call). The source tree's package
is tested (python/ put first on sys.path) unless FO_TEST_INSTALLED=1, which
tests the one the interpreter has installed.
"""

import ctypes
import hashlib
import base64
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import types
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if not os.environ.get("FO_TEST_INSTALLED"):
    sys.path.insert(0, os.path.join(REPO, "python"))

import flashoverlap  # noqa: E402
from flashoverlap import FlashOverlapError, InvalidArgument, NoGpu, _capi  # noqa: E402

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HEADER = os.path.join(REPO, "include", "flashoverlap", "flashoverlap_c.h")


def project_version():
    """The CMake project's version (ctest passes it; else CMakeLists.txt's)."""
    v = os.environ.get("FO_PROJECT_VERSION")
    if v:
        return v
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        return re.search(r"project\(FlashOverlap VERSION ([0-9.]+)", f.read()).group(1)


def run_python(code, **env):
    """Runs code in a fresh interpreter that finds the package under test; returns stdout."""
    e = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **env)
    e["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(flashoverlap.__file__))] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"the child failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


# A child's guard: an import of torch fails, so that a dependency on it shows.
BLOCK_TORCH = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, _Block())
"""


class Import(unittest.TestCase):
    def test_import_imports_no_torch_and_loads_nothing(self):
        out = run_python(BLOCK_TORCH + """
import flashoverlap, flashoverlap.torch
from flashoverlap.torch import GemmAllReduce, GemmReduceScatter, gemm_all_reduce, gemm_reduce_scatter
from flashoverlap.torch import GemmAllToAll, gemm_all_to_all
maps = open("/proc/self/maps").read()
print("torch" in sys.modules, "libflashoverlap" in maps, "libnccl" in maps)
""")
        self.assertEqual(out.split(), ["False", "False", "False"])

    def test_public_names(self):
        import flashoverlap.torch as fot
        for name in ("GemmAllReduce", "GemmReduceScatter", "GemmAllToAll", "Communicator", "unique_id"):
            self.assertIn(name, flashoverlap.__all__)
        self.assertIs(flashoverlap.GemmReduceScatter, _capi.GemmReduceScatter)
        self.assertIs(flashoverlap.GemmAllToAll, _capi.GemmAllToAll)
        for name in ("GemmAllReduce", "GemmReduceScatter", "GemmAllToAll", "gemm_all_reduce", "gemm_reduce_scatter",
                     "gemm_all_to_all", "clear_cache"):
            self.assertIn(name, fot.__all__)
            self.assertTrue(hasattr(fot, name), name)

    def test_ctypes_layer_works_without_torch(self):
        out = run_python(BLOCK_TORCH + """
import flashoverlap, flashoverlap.torch
print(flashoverlap.load().version())
assert flashoverlap.GemmReduceScatter.__name__ == "GemmReduceScatter"
assert flashoverlap.GemmAllToAll.__name__ == "GemmAllToAll"
try:
    flashoverlap.torch.require_torch()
except flashoverlap.FlashOverlapError as e:
    print("refused:", e)
""")
        lines = out.splitlines()
        self.assertEqual(lines[0], project_version())
        self.assertIn("refused: flashoverlap.torch needs PyTorch >= 2.4", lines[1])

    def test_versions_match_the_project(self):
        self.assertEqual(flashoverlap.__version__, project_version())
        self.assertEqual(flashoverlap.load().version(), project_version())

    def test_library_path_from_the_environment(self):
        saved = os.environ.get(flashoverlap.LIBRARY_ENV)
        try:
            os.environ[flashoverlap.LIBRARY_ENV] = "/nonexistent/libflashoverlap.so"
            with self.assertRaisesRegex(FlashOverlapError, "FLASHOVERLAP_LIBRARY=/nonexistent/libflashoverlap.so: no such"):
                flashoverlap.library_path()
        finally:
            if saved is None:
                os.environ.pop(flashoverlap.LIBRARY_ENV)
            else:
                os.environ[flashoverlap.LIBRARY_ENV] = saved
        if saved:
            self.assertEqual(flashoverlap.library_path(), os.path.abspath(saved))

    def test_exceptions(self):
        self.assertTrue(issubclass(InvalidArgument, ValueError))
        self.assertTrue(issubclass(InvalidArgument, FlashOverlapError) and issubclass(NoGpu, FlashOverlapError))
        for status, cls in ((1, InvalidArgument), (2, NoGpu), (3, FlashOverlapError), (42, FlashOverlapError)):
            e = flashoverlap.error_for(status, "f: what")
            self.assertIs(type(e), cls)
            self.assertEqual((str(e), e.status), ("f: what", status))


@unittest.skipUnless(HAVE_TORCH, "torch is not installed: import order not tested")
class ImportOrder(unittest.TestCase):
    """torch before and after flashoverlap: both work, and one NCCL serves."""

    CHECK = """
import os, flashoverlap, flashoverlap.torch
from flashoverlap import _capi
lib = flashoverlap.load()
assert float(torch.ones(3).sum()) == 3.0
print(lib.version(), len(_capi.mapped_nccl_files()))
tc = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
if os.path.exists(tc):
    print("shared", lib.shares_nccl_with(tc))
"""

    def check(self, code):
        lines = run_python(code).splitlines()
        version, ncclfiles = lines[0].split()
        self.assertEqual(version, project_version())
        self.assertEqual(ncclfiles, "1", "one libnccl file mapped")
        for line in lines[1:]:  # (a CUDA torch: its NCCL must be ours)
            self.assertEqual(line, "shared (True, '')")

    def test_torch_first(self):
        self.check("import torch\n" + self.CHECK)

    def test_flashoverlap_first(self):
        self.check("import flashoverlap\nimport torch\n" + self.CHECK)


def _header_functions():
    """{name: parameter count} of every FO_C_API function of flashoverlap_c.h."""
    with open(HEADER) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    out = {}
    for m in re.finditer(r"FO_C_API\s+[\w\s\*]*?\b(fo_\w+)\s*\(([^)]*)\)\s*;", text):
        params = m.group(2).strip()
        out[m.group(1)] = 0 if params in ("", "void") else len(params.split(","))
    return out


class CApi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.lib = flashoverlap.load()
        cls.c = cls.lib.c
        try:
            _capi.Communicator.from_env().close()
            cls.gpu = True
        except NoGpu:
            cls.gpu = False

    @unittest.skipUnless(os.path.isfile(HEADER), "no flashoverlap_c.h beside these tests")
    def test_every_header_function_is_declared(self):
        header = _header_functions()
        self.assertGreaterEqual(len(header), 32)
        self.assertTrue(any(n.startswith("fo_gemm_reducescatter_") for n in header))
        self.assertTrue(any(n.startswith("fo_gemm_alltoall_") for n in header))
        self.assertEqual(sorted(header), sorted(_capi._PROTOTYPES))
        for name, count in header.items():
            self.assertEqual(len(_capi._PROTOTYPES[name][1]), count, name)
        with open(HEADER) as f:
            self.assertEqual(int(re.search(r"#define FO_C_ABI_VERSION (\d+)", f.read()).group(1)), _capi.C_ABI_VERSION)

    def test_abi_version(self):
        self.assertEqual(self.lib.abi_version(), _capi.C_ABI_VERSION)

    def test_allreduce_curve_path(self):
        self.assertEqual(flashoverlap.allreduce_curve_path("dir", 8, 4, "bf16"), "dir/allreduce-ctas8-w4-bf16.json")
        self.assertEqual(_capi.allreduce_curve_path("d", 0, 2, "fp16"), "d/allreduce-ctasdefault-w2-fp16.json")
        with self.assertRaisesRegex(InvalidArgument, "nccl_ctas = -1"):
            _capi.allreduce_curve_path("d", -1, 2)

    def test_planning_calls(self):
        # The plan each op runs, from the model, as the CLI prints it (the same C++ call underneath).
        cli = os.environ.get("FLASHOVERLAP_CLI")
        rng = random.Random()
        m, n, k, world = 128 * rng.randint(1, 64), 1024 * rng.randint(1, 8), 8 * rng.randint(64, 1024), 2
        for op, plan in (("allreduce", flashoverlap.plan_gemm_allreduce),
                         ("reducescatter", flashoverlap.plan_gemm_reducescatter)):
            with self.subTest(op=op, m=m, n=n, k=k):
                text = plan(m, n, k, world)
                self.assertTrue(text)
                self.assertEqual(plan(m, n, k, 1).split(",")[0].split(":")[0], "sequential")
                if cli:
                    out = subprocess.run([cli, "plan", "--op", op, "--m", str(m), "--n", str(n), "--k", str(k),
                                          "--world", str(world), "--json"], capture_output=True, text=True, check=True)
                    self.assertEqual(json.loads(out.stdout)["op_plan"], text)
        with self.assertRaisesRegex(InvalidArgument, "m must be >= 1"):
            flashoverlap.plan_gemm_allreduce(0, 4096, 4096, 2)
        with self.assertRaisesRegex(InvalidArgument, "path"):
            flashoverlap.plan_gemm_reducescatter(4096, 4096, 4096, 2, path="row_bands")
        # All-to-All: two ranks, each token of each rank picks one rank at random.
        tokens = rng.randint(1, 2000)
        rows = [[], []]  # by expert rank: (source rank, token, gate), in the dispatch's order
        for src in range(2):
            for t in range(tokens):
                rows[rng.randrange(2)].append((src, t, rng.random()))
        routings = []
        for e in range(2):
            send = [sum(1 for r in rows[e] if r[0] == d) for d in range(2)]
            recv = [sum(1 for r in rows[s] if r[0] == e) for s in range(2)]
            routings.append({"dest_rank": [r[0] for r in rows[e]], "dest_token": [r[1] for r in rows[e]],
                             "gate": [r[2] for r in rows[e]], "tokens": tokens, "send_counts": send,
                             "recv_counts": recv})
        text = flashoverlap.plan_gemm_alltoall(routings, n, k)
        self.assertRegex(text, r"^(sequential, .*; our GEMM|slots: waves .*)$")
        if cli:
            picks = [[[] for _ in range(tokens)] for _ in range(2)]
            for e in range(2):
                for src, t, gate in rows[e]:
                    picks[src][t].append([e, gate])
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "routing.json")
                with open(path, "w") as f:
                    json.dump({"format": "flashoverlap.moe_routing", "schema": 1, "world": 2, "picks": picks}, f)
                out = subprocess.run([cli, "plan", "--op", "alltoall", "--m", str(tokens), "--n", str(n), "--k", str(k),
                                      "--world", "2", "--routing", "file:" + path, "--json"], capture_output=True,
                                     text=True, check=True)
            self.assertEqual(json.loads(out.stdout)["op_plan"], text)
        routings[0]["recv_counts"] = [routings[0]["recv_counts"][0], routings[0]["recv_counts"][1] + 1]
        with self.assertRaisesRegex(InvalidArgument, r"rank 0's recv_counts\[1\]"):
            flashoverlap.plan_gemm_alltoall(routings, n, k)

    def test_planning_with_several_experts(self):
        # The planning call with experts in the options and each routing's expert_counts (the ctypes structs'
        # appended fields): at world 1 with every row on one expert the plan is one expert's; what does not add up
        # is the library's refusal, named.
        rng = random.Random()
        for _ in range(4):
            rows, experts, n, k = rng.randint(1, 3000), rng.randint(2, 7), 4096, 2048
            on = rng.randrange(experts)
            counts = [rows if e == on else 0 for e in range(experts)]
            r = {"dest_rank": [0] * rows, "dest_token": list(range(rows)), "gate": [0.5] * rows, "tokens": rows,
                 "send_counts": [rows], "recv_counts": [rows]}
            one = flashoverlap.plan_gemm_alltoall([r], n, k)
            with self.subTest(rows=rows, experts=experts):
                self.assertEqual(flashoverlap.plan_gemm_alltoall([dict(r, expert_counts=counts)], n, k,
                                                                 experts=experts), one)
                with self.assertRaisesRegex(InvalidArgument, "expert_counts must not be null"):
                    flashoverlap.plan_gemm_alltoall([r], n, k, experts=experts)
                with self.assertRaisesRegex(InvalidArgument, "expert_counts is for several experts per rank"):
                    flashoverlap.plan_gemm_alltoall([dict(r, expert_counts=[rows])], n, k)
                short = [c - 1 if e == on else c for e, c in enumerate(counts)]
                with self.assertRaisesRegex(InvalidArgument, "rank 0"):
                    flashoverlap.plan_gemm_alltoall([dict(r, expert_counts=short)], n, k, experts=experts)
                # (the NVLink form with experts: every row in one expert plans as one expert's rows)
                self.assertEqual(flashoverlap.plan_gemm_alltoall([dict(r, expert_counts=counts)], n, k,
                                                                 experts=experts, path="nvlink"),
                                 flashoverlap.plan_gemm_alltoall([r], n, k, path="nvlink"))
                with self.assertRaisesRegex(InvalidArgument, f"^expert_counts has {experts - 1} entries, expected "
                                                             f"{experts}$"):
                    flashoverlap.plan_gemm_alltoall([dict(r, expert_counts=counts[1:])], n, k, experts=experts)

    def test_local_gpus(self):
        # (any machine: a count and its reason that agree)
        g = flashoverlap.local_gpus()
        self.assertEqual(g, self.lib.local_gpus())
        self.assertIsInstance(g.hopper, int)
        self.assertIsInstance(g.cuda_failed, bool)
        self.assertGreaterEqual(g.hopper, 0)
        self.assertEqual(g.hopper == 0, g.reason != "", g)

    def test_all_gather_rows_prototype(self):
        # fo_status (fo_gemm_reducescatter_t op, const void* local, void* full, int64_t m, void* stream)
        restype, argtypes = _capi._PROTOTYPES["fo_gemm_reducescatter_all_gather_rows"]
        self.assertIs(restype, _capi._STATUS)
        self.assertEqual(argtypes, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p])
        names = list(_capi._PROTOTYPES)  # (in the header's order: after _rows, before _prepare)
        self.assertEqual(names.index("fo_gemm_reducescatter_all_gather_rows"),
                         names.index("fo_gemm_reducescatter_rows") + 1)
        f = self.c.fo_gemm_reducescatter_all_gather_rows
        self.assertEqual((f.argtypes, f.restype), (argtypes, ctypes.c_int))
        # (the status is checked: a failure raises, with the C message)
        with self.assertRaisesRegex(InvalidArgument, "^fo_gemm_reducescatter_all_gather_rows: op is NULL$"):
            f(None, 0x1000, 0x2000, 128, 0x3000)
        if os.path.isfile(HEADER):
            with open(HEADER) as h:
                text = re.sub(r"\s+", " ", h.read())
            self.assertIn("FO_C_API fo_status fo_gemm_reducescatter_all_gather_rows(fo_gemm_reducescatter_t op, const "
                          "void* local, void* full, int64_t m, void* stream);", text)

    def test_all_gather_rows_method_passes_its_arguments(self):
        calls = []
        lib = types.SimpleNamespace(c=types.SimpleNamespace(
            fo_gemm_reducescatter_all_gather_rows=lambda *args: calls.append(args)))
        op = object.__new__(_capi.GemmReduceScatter)
        _capi._Handle.__init__(op, lib, ctypes.c_void_p(0x1234))
        op.all_gather_rows(0x10, 0x20, 256, 0x30)
        op.all_gather_rows(0x10, 0x20, 7)
        op.all_gather_rows(0x10, 0x20, 7, 0)  # (0: the legacy default stream, NULL)
        self.assertEqual([(h.value,) + tuple(rest) for h, *rest in calls],
                         [(0x1234, 0x10, 0x20, 256, 0x30), (0x1234, 0x10, 0x20, 7, None), (0x1234, 0x10, 0x20, 7, None)])
        op._handle = None  # (nothing to destroy)

    def test_abi_mismatch_is_refused(self):
        saved = _capi.C_ABI_VERSION
        _capi.C_ABI_VERSION = saved + 1
        try:
            with self.assertRaisesRegex(FlashOverlapError, f"speaks C ABI {saved}, .* C ABI {saved + 1}"):
                _capi.Library(self.lib.path)
        finally:
            _capi.C_ABI_VERSION = saved

    def test_not_a_library(self):
        with self.assertRaisesRegex(FlashOverlapError, "cannot load " + re.escape(__file__)):
            _capi.Library(__file__)

    def test_status_strings(self):
        for code, name in ((0, "FO_OK"), (1, "FO_INVALID_ARGUMENT"), (2, "FO_NO_GPU"), (3, "FO_ERROR"),
                           (9, "unknown fo_status")):
            self.assertEqual(self.lib.status_string(code), name)

    def test_null_handles_are_invalid_arguments_with_the_c_message(self):
        h, i, i64, sz = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int64(), ctypes.c_size_t()
        b = ctypes.byref
        cases = [
            (lambda: self.c.fo_comm_rank(None, b(i)), "fo_comm_rank: comm is NULL"),
            (lambda: self.c.fo_comm_world(None, b(i)), "fo_comm_world: comm is NULL"),
            (lambda: self.c.fo_comm_nccl(None, b(h)), "fo_comm_nccl: comm is NULL"),
            (lambda: self.c.fo_comm_adopt(None, b(h)), "fo_comm_adopt: nccl_comm is NULL"),
            (lambda: self.c.fo_comm_from_env(None), "fo_comm_from_env: out is NULL"),
            (lambda: self.c.fo_unique_id(None, 128), "fo_unique_id: id is NULL"),
            (lambda: self.c.fo_gemm_allreduce_create(None, 128, 128, 128, 0, None, b(h)),
             "fo_gemm_allreduce_create: comm is NULL"),
            (lambda: self.c.fo_gemm_allreduce_run(None, 1, 1, 1, 1, None, 0), "fo_gemm_allreduce_run: op is NULL"),
            (lambda: self.c.fo_gemm_allreduce_run_rmsnorm(None, 1, 1, 1, 1, 1e-6, 1, None, 1, None),
             "fo_gemm_allreduce_run_rmsnorm: op is NULL"),
            (lambda: self.c.fo_gemm_allreduce_prepare(None, 1), "fo_gemm_allreduce_prepare: op is NULL"),
            (lambda: self.c.fo_gemm_allreduce_plan(None, 1, None, 0, b(sz)), "fo_gemm_allreduce_plan: op is NULL"),
            (lambda: self.c.fo_gemm_allreduce_check(None), "fo_gemm_allreduce_check: op is NULL"),
            (lambda: self.c.fo_gemm_allreduce_shape(None, b(i64), None, None, None),
             "fo_gemm_allreduce_shape: op is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_options_default(None, 32),
             "fo_gemm_reducescatter_options_default: options is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_create(None, 128, 128, 128, 0, None, b(h)),
             "fo_gemm_reducescatter_create: comm is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_create(None, 128, 128, 128, 0, None, None),
             "fo_gemm_reducescatter_create: out is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_run(None, 1, 1, 1, 2, None, 0),
             "fo_gemm_reducescatter_run: op is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_run_rmsnorm(None, 1, 1, 1, 1, 1e-6, 1, None, 2, None),
             "fo_gemm_reducescatter_run_rmsnorm: op is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_rows_out(None, 2, b(i64)), "fo_gemm_reducescatter_rows_out: op is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_rows(None, 2, None, 0, b(sz)), "fo_gemm_reducescatter_rows: op is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_all_gather_rows(None, 1, 1, 2, None),
             "fo_gemm_reducescatter_all_gather_rows: op is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_all_gather_rows(None, None, None, 2, None),  # (the handle first)
             "fo_gemm_reducescatter_all_gather_rows: op is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_prepare(None, 2), "fo_gemm_reducescatter_prepare: op is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_plan(None, 2, None, 0, b(sz)), "fo_gemm_reducescatter_plan: op is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_check(None), "fo_gemm_reducescatter_check: op is NULL"),
            (lambda: self.c.fo_gemm_reducescatter_shape(None, b(i64), None, None, None, b(i)),
             "fo_gemm_reducescatter_shape: op is NULL"),
            (lambda: self.c.fo_gemm_alltoall_options_default(None, 24),
             "fo_gemm_alltoall_options_default: options is NULL"),
            (lambda: self.c.fo_gemm_alltoall_create(None, 128, 128, 1, 128, 128, 0, None, b(h)),
             "fo_gemm_alltoall_create: comm is NULL"),
            (lambda: self.c.fo_gemm_alltoall_create(None, 128, 128, 1, 128, 128, 0, None, None),
             "fo_gemm_alltoall_create: out is NULL"),
            (lambda: self.c.fo_gemm_alltoall_run(None, 1, 1, b(_capi.make_routing(0, [], [], None, 0, [0], [0], 1)[0]),
                                                 1, 0, 1, None, None),
             "fo_gemm_alltoall_run: op is NULL"),
            (lambda: self.c.fo_gemm_alltoall_run(None, None, None, None, None, 0, 0, None, None),  # (the handle first)
             "fo_gemm_alltoall_run: op is NULL"),
            (lambda: self.c.fo_gemm_alltoall_last_plan(None, None, 0, b(sz)), "fo_gemm_alltoall_last_plan: op is NULL"),
            (lambda: self.c.fo_gemm_alltoall_check(None), "fo_gemm_alltoall_check: op is NULL"),
            (lambda: self.c.fo_gemm_alltoall_shape(None, b(i64), None, b(i), None, None, None, b(i)),
             "fo_gemm_alltoall_shape: op is NULL"),
        ]
        for call, message in cases:
            with self.subTest(message):
                with self.assertRaises(InvalidArgument) as cm:
                    call()
                self.assertEqual(str(cm.exception), message)
                self.assertEqual(cm.exception.status, flashoverlap.FO_INVALID_ARGUMENT)
                self.assertIsInstance(cm.exception, ValueError)
                self.assertEqual(self.lib.last_error(), message)

    def test_success_clears_the_last_error(self):
        with self.assertRaises(InvalidArgument):
            self.c.fo_comm_rank(None, ctypes.byref(ctypes.c_int()))
        self.assertEqual(self.c.fo_comm_destroy(None), 0)  # (NULL: nothing, as free())
        self.assertEqual(self.c.fo_gemm_allreduce_destroy(None), 0)
        self.assertEqual(self.lib.last_error(), "")
        with self.assertRaises(InvalidArgument):
            self.c.fo_gemm_reducescatter_check(None)
        self.assertEqual(self.c.fo_gemm_reducescatter_destroy(None), 0)
        self.assertEqual(self.lib.last_error(), "")
        with self.assertRaises(InvalidArgument):
            self.c.fo_gemm_alltoall_check(None)
        self.assertEqual(self.c.fo_gemm_alltoall_destroy(None), 0)
        self.assertEqual(self.lib.last_error(), "")

    def test_values_are_checked_before_the_handle(self):
        h = ctypes.c_void_p()
        with self.assertRaisesRegex(InvalidArgument, "^fo_gemm_allreduce_create: dtype = 7 is not an fo_dtype"):
            self.c.fo_gemm_allreduce_create(None, 128, 128, 128, 7, None, ctypes.byref(h))
        o = _capi.make_options(self.lib)
        o.path = 9
        with self.assertRaisesRegex(InvalidArgument, r"options->path = 9 is not an fo_path"):
            self.c.fo_gemm_allreduce_create(None, 128, 128, 128, 0, ctypes.byref(o), ctypes.byref(h))
        for path in (4, 5):  # (FO_PATH_NVLINK, and FO_PATH_OWNERS, its former name: a path; the comm is checked next)
            o.path = path
            with self.assertRaisesRegex(InvalidArgument, r"comm is NULL"):
                self.c.fo_gemm_allreduce_create(None, 128, 128, 128, 0, ctypes.byref(o), ctypes.byref(h))
        self.assertIsNone(h.value)

    def test_reducescatter_values_are_checked_before_the_handle(self):
        h = ctypes.c_void_p()
        create = lambda o: self.c.fo_gemm_reducescatter_create(None, 128, 128, 128, 0, o, ctypes.byref(h))  # noqa: E731
        with self.assertRaisesRegex(InvalidArgument, "^fo_gemm_reducescatter_create: dtype = 7 is not an fo_dtype"):
            self.c.fo_gemm_reducescatter_create(None, 128, 128, 128, 7, None, ctypes.byref(h))
        cases = (
            ("path", 2, r"^fo_gemm_reducescatter_create: options->path = 2 \(FO_PATH_ROW_BANDS\) is not a "
                        r"GemmReduceScatter path \(FO_PATH_AUTO 0, FO_PATH_SEQUENTIAL 1, FO_PATH_SLOTS 3, "
                        r"FO_PATH_NVLINK 5\)$"),
            ("path", 4, r"options->path = 4 \(FO_PATH_OWNERS\) is not a GemmReduceScatter path"),
            ("path", 9, r"options->path = 9 is not an fo_path of GemmReduceScatter"),
            ("layout", 2, r"^fo_gemm_reducescatter_create: options->layout = 2 is not an fo_rs_layout "
                          r"\(FO_RS_LAYOUT_STANDARD 0, FO_RS_LAYOUT_SUBTILE 1\)$"),
            ("struct_size", 16, r"options->struct_size = 16 is below 32 \(fill the options with "
                                r"fo_gemm_reducescatter_options_default\(&o, sizeof o\) first\)"),
        )
        for field, value, message in cases:
            with self.subTest(field=field, value=value):
                o = _capi.make_rs_options(self.lib)
                setattr(o, field, value)
                h.value = 1234  # (garbage: must come back NULL)
                with self.assertRaisesRegex(InvalidArgument, message):
                    create(ctypes.byref(o))
                self.assertIsNone(h.value)
        for path in ("auto", "sequential", "slots"):  # (accepted: the refusal is the communicator's)
            for layout in ("standard", "subtile"):
                o = _capi.make_rs_options(self.lib, path, layout)
                with self.assertRaisesRegex(InvalidArgument, "^fo_gemm_reducescatter_create: comm is NULL$"):
                    create(ctypes.byref(o))

    def test_reducescatter_options_of_a_later_header(self):
        class Later(ctypes.Structure):
            _fields_ = [("o", _capi.RsOptions), ("added", ctypes.c_int64)]

        later = Later()
        ctypes.memset(ctypes.byref(later), 0xab, ctypes.sizeof(later))
        self.c.fo_gemm_reducescatter_options_default(ctypes.cast(ctypes.byref(later), ctypes.POINTER(_capi.RsOptions)),
                                                     ctypes.sizeof(later))
        self.assertEqual((later.o.struct_size, later.o.nccl_sms, later.o.layout, later.added), (56, 8, 0, 0))
        h = ctypes.c_void_p()
        p = ctypes.cast(ctypes.byref(later), ctypes.POINTER(_capi.RsOptions))
        with self.assertRaisesRegex(InvalidArgument, "comm is NULL"):
            self.c.fo_gemm_reducescatter_create(None, 128, 128, 128, 0, p, ctypes.byref(h))
        later.added = 1
        with self.assertRaisesRegex(InvalidArgument, r"options->struct_size = 56: the options set fields that this "
                                    r"library \(flashoverlap [0-9.]+, options of 48 bytes\) does not know"):
            self.c.fo_gemm_reducescatter_create(None, 128, 128, 128, 0, p, ctypes.byref(h))
        # a caller of the second version (no input, scales): 16-bit inputs, those bytes not read
        second = _capi.make_rs_options(self.lib)
        second.struct_size, second.input = 40, 9
        with self.assertRaisesRegex(InvalidArgument, "comm is NULL"):
            self.c.fo_gemm_reducescatter_create(None, 128, 128, 128, 0, ctypes.byref(second), ctypes.byref(h))
        third = _capi.make_rs_options(self.lib, input="e4m3", scales="tensor")
        self.assertEqual((third.input, third.scales), (1, 1))
        third.scales = 9
        with self.assertRaisesRegex(InvalidArgument, "options->scales = 9 is not an fo_scale_kind"):
            self.c.fo_gemm_reducescatter_create(None, 128, 128, 128, 0, ctypes.byref(third), ctypes.byref(h))
        # a caller of the first version (no tuning_cache): accepted, the field not read
        first = _capi.make_rs_options(self.lib)
        first.struct_size = 32
        first.tuning_cache = b"/nonexistent/picks.json"
        with self.assertRaisesRegex(InvalidArgument, "comm is NULL"):
            self.c.fo_gemm_reducescatter_create(None, 128, 128, 128, 0, ctypes.byref(first), ctypes.byref(h))

    def test_options(self):
        o = _capi.make_options(self.lib)
        self.assertEqual((o.struct_size, o.path, o.nccl_sms, o.wait_timeout_s, o.check_m, o.reserved_, o.curves,
                          o.tuning_cache, o.input, o.scales), (56, 0, 8, 30.0, 0, 0, None, None, 0, 0))
        # FP8 inputs and their scales' kind (fo_input_type, fo_scale_kind); the library checks the values too
        o = _capi.make_options(self.lib, input="e4m3", scales="row")
        self.assertEqual((o.input, o.scales), (1, 2))
        for kw, message in (({"input": "fp8"}, "input = 'fp8': one of 'same', 'e4m3'"),
                            ({"scales": "block"}, "scales = 'block': one of 'none', 'tensor', 'row'")):
            with self.assertRaisesRegex(InvalidArgument, message):
                _capi.make_options(self.lib, **kw)
        bad = _capi.make_options(self.lib)
        bad.input = 7
        with self.assertRaisesRegex(InvalidArgument, "options->input = 7 is not an fo_input_type"):
            self.c.fo_plan_gemm_allreduce(64, 256, 256, 1, 0, ctypes.byref(bad), 132, b"H", None, 0, None)
        # a caller of the second version (no input, scales): 16-bit inputs, those bytes not read
        second = _capi.make_options(self.lib)
        second.struct_size, second.input = 48, 1
        self.assertEqual(self.c.fo_plan_gemm_allreduce(4096, 8192, 8192, 2, 0, ctypes.byref(second), 132, b"H", None,
                                                        0, None), 0)
        fp8_plan = flashoverlap.plan_gemm_allreduce(4096, 8192, 8192, 2, input="e4m3", scales="row")
        self.assertRegex(fp8_plan, "128x(128|192)")  # (the FP8 GEMM's tiles, never 16-bit's 128x256)
        self.assertNotIn("128x256", fp8_plan)
        with self.assertRaisesRegex(InvalidArgument, "FP8 inputs need k % 16 == 0"):
            flashoverlap.plan_gemm_allreduce(4096, 8192, 8200, 2, input="e4m3")
        with self.assertRaisesRegex(InvalidArgument, "scales are for FP8 inputs"):
            flashoverlap.plan_gemm_allreduce(4096, 8192, 8192, 2, scales="tensor")
        o = _capi.make_options(self.lib, "slots", nccl_sms=16, wait_timeout_s=5, check_m=True, curves="/tmp/c",
                               tuning_cache="/tmp/t.json")
        self.assertEqual((o.path, o.nccl_sms, o.wait_timeout_s, o.check_m, o.curves, o.tuning_cache),
                         (3, 16, 5.0, 1, b"/tmp/c", b"/tmp/t.json"))
        with self.assertRaisesRegex(InvalidArgument, "path = 'rows': one of 'auto', 'sequential', 'row_bands'"):
            _capi.make_options(self.lib, "rows")
        with self.assertRaisesRegex(InvalidArgument, "struct_size = 8 is below 40"):
            self.c.fo_gemm_allreduce_options_default(ctypes.byref(_capi.Options()), 8)

    def test_reducescatter_options(self):
        o = _capi.make_rs_options(self.lib)
        self.assertEqual(ctypes.sizeof(o), 48)
        self.assertEqual((o.struct_size, o.path, o.layout, o.nccl_sms, o.wait_timeout_s, o.check_m, o.tuning_cache,
                          o.input, o.scales), (48, 0, 0, 8, 30.0, 0, None, 0, 0))
        # (the fields shared with fo_gemm_allreduce_options at its offsets)
        for name in ("path", "nccl_sms", "wait_timeout_s", "check_m"):
            self.assertEqual(getattr(_capi.RsOptions, name).offset, getattr(_capi.Options, name).offset, name)
        o = _capi.make_rs_options(self.lib, "slots", "subtile", nccl_sms=16, wait_timeout_s=5, check_m=True,
                                  tuning_cache="/tmp/t.json")
        self.assertEqual((o.path, o.layout, o.nccl_sms, o.wait_timeout_s, o.check_m, o.tuning_cache),
                         (3, 1, 16, 5.0, 1, b"/tmp/t.json"))
        self.assertEqual(_capi.make_rs_options(self.lib, "sequential").path, 1)
        self.assertEqual(_capi.make_rs_options(self.lib, "nvlink").path, 5)
        for bad in ("row_bands", "owners", "rows"):
            with self.assertRaisesRegex(InvalidArgument, f"path = '{bad}': one of 'auto', 'sequential', 'slots'"):
                _capi.make_rs_options(self.lib, bad)
        with self.assertRaisesRegex(InvalidArgument, "layout = 'sub_tile': one of 'standard', 'subtile'"):
            _capi.make_rs_options(self.lib, layout="sub_tile")
        for size in (8, 31):
            with self.assertRaisesRegex(InvalidArgument, f"^fo_gemm_reducescatter_options_default: struct_size = {size} "
                                        "is below 32 \\(pass sizeof \\*options\\)$"):
                self.c.fo_gemm_reducescatter_options_default(ctypes.byref(_capi.RsOptions()), size)

    def test_reducescatter_ctypes_class_checks_its_arguments_first(self):
        closed = _capi.Communicator(self.lib, ctypes.c_void_p())
        with self.assertRaisesRegex(InvalidArgument, "layout = 'diagonal'"):
            _capi.GemmReduceScatter(closed, 128, 128, 128, "bf16", layout="diagonal")
        with self.assertRaisesRegex(InvalidArgument, "path = 'owners'"):
            _capi.GemmReduceScatter(closed, 128, 128, 128, "bf16", path="owners")
        with self.assertRaisesRegex(InvalidArgument, "dtype = 'fp32': bf16 or fp16"):
            _capi.GemmReduceScatter(closed, 128, 128, 128, "fp32")
        with self.assertRaisesRegex(FlashOverlapError, "this Communicator is closed"):
            _capi.GemmReduceScatter(closed, 128, 128, 128, "bf16", layout="subtile", path="slots")

    # ---- GemmAllToAll ----

    def test_grouped_gemm_surface(self):
        # The C calls as the header declares them, the options' defaults and paths, and the values checked
        # before any GPU is touched (the GPU tests run the op itself).
        v, i64, P = ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER
        self.assertEqual(_capi._PROTOTYPES["fo_gemm_grouped_run"], (_capi._STATUS, [v, v, v, P(i64), v, i64, v]))
        self.assertEqual(_capi._PROTOTYPES["fo_gemm_grouped_create"],
                         (_capi._STATUS, [i64, ctypes.c_int, i64, i64, ctypes.c_int, P(_capi.GroupedOptions), P(v)]))
        self.assertEqual(_capi.make_grouped_options(self.lib).path, 0)
        self.assertEqual(_capi.make_grouped_options(self.lib, "cublas").path, 2)
        with self.assertRaisesRegex(InvalidArgument, "GroupedGemm's"):
            _capi.make_grouped_options(self.lib, "sideways")
        for args, message in (((0, 4, 64, 64), "max_m"), ((64, 0, 64, 64), "experts must be in"),
                              ((64, 4, 64, 60), "k a multiple of 8")):
            with self.subTest(args=args), self.assertRaisesRegex(InvalidArgument, message):
                flashoverlap.GroupedGemm(*args, "bf16")
        bad = _capi.GroupedOptions()
        self.lib.c.fo_gemm_grouped_options_default(ctypes.byref(bad), ctypes.sizeof(bad))
        bad.path = 7
        out = ctypes.c_void_p()
        with self.assertRaisesRegex(InvalidArgument, "not a grouped GEMM path"):
            self.lib.c.fo_gemm_grouped_create(64, 4, 64, 64, 0, ctypes.byref(bad), ctypes.byref(out))
        if not self.gpu:
            with self.assertRaises(flashoverlap.FlashOverlapError):  # (NoGpu, or CUDA's error)
                flashoverlap.GroupedGemm(64, 4, 64, 64, "bf16")

    def test_alltoall_prototypes(self):
        P, i32, i64, v = ctypes.POINTER, ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p
        # fo_status (fo_gemm_alltoall_t op, const void* a, const void* b, const fo_alltoall_routing* routing,
        #            void* out, int64_t ld_out, int combine, int32_t* tokens_out, void* stream)
        self.assertEqual(_capi._PROTOTYPES["fo_gemm_alltoall_run"],
                         (_capi._STATUS, [v, v, v, P(_capi.Routing), v, i64, ctypes.c_int, P(i32), v]))
        self.assertEqual(_capi._PROTOTYPES["fo_gemm_alltoall_create"],
                         (_capi._STATUS, [v, i64, i64, ctypes.c_int, i64, i64, ctypes.c_int, P(_capi.A2aOptions),
                                          P(v)]))
        self.assertEqual(_capi._PROTOTYPES["fo_gemm_alltoall_shape"][1],
                         [v, P(i64), P(i64), P(ctypes.c_int), P(i64), P(i64), P(ctypes.c_int), P(ctypes.c_int)])
        names = list(_capi._PROTOTYPES)  # (in the header's order, after GemmReduceScatter's)
        self.assertEqual(names[names.index("fo_gemm_reducescatter_destroy") + 1:names.index("fo_gemm_alltoall_destroy") + 1],
                         ["fo_gemm_alltoall_options_default", "fo_gemm_alltoall_create", "fo_gemm_alltoall_run",
                          "fo_gemm_alltoall_run_scaled", "fo_gemm_alltoall_last_plan", "fo_gemm_alltoall_check",
                          "fo_gemm_alltoall_shape", "fo_gemm_alltoall_destroy"])
        # (run's arguments, then scale_a and scale_b)
        self.assertEqual(_capi._PROTOTYPES["fo_gemm_alltoall_run_scaled"],
                         (_capi._STATUS, [v, v, v, P(_capi.Routing), v, i64, ctypes.c_int, P(i32), v, v, v]))
        for name in ("fo_gemm_alltoall_run", "fo_gemm_alltoall_run_scaled", "fo_gemm_alltoall_create"):
            f = getattr(self.c, name)
            self.assertEqual((f.argtypes, f.restype), (_capi._PROTOTYPES[name][1], ctypes.c_int))
        if os.path.isfile(HEADER):
            with open(HEADER) as h:
                text = re.sub(r"\s+", " ", h.read())
            self.assertIn("FO_C_API fo_status fo_gemm_alltoall_run(fo_gemm_alltoall_t op, const void* a, const void* "
                          "b, const fo_alltoall_routing* routing, void* out, int64_t ld_out, int combine, int32_t* "
                          "tokens_out, void* stream);", text)
            self.assertIn("FO_C_API fo_status fo_gemm_alltoall_run_scaled(fo_gemm_alltoall_t op, const void* a, "
                          "const void* b, const fo_alltoall_routing* routing, void* out, int64_t ld_out, int combine, "
                          "int32_t* tokens_out, void* stream, const float* scale_a, const float* scale_b);", text)
            self.assertIn("FO_C_API fo_status fo_gemm_alltoall_create(fo_comm_t comm, int64_t max_rows, int64_t "
                          "max_tokens, int topk, int64_t n, int64_t k, fo_dtype dtype, const "
                          "fo_gemm_alltoall_options* options, fo_gemm_alltoall_t* out);", text)

    def test_alltoall_structs(self):
        # (the fields fo_gemm_alltoall_options shares with fo_gemm_allreduce_options at its offsets; experts,
        # input and scales, and expert_counts appended, as the C header has them)
        self.assertEqual(ctypes.sizeof(_capi.A2aOptions), 48)
        self.assertEqual((_capi.A2aOptions.exchange_timeout_s.offset, _capi.A2aOptions.experts.offset,
                          _capi.A2aOptions.input.offset, _capi.A2aOptions.scales.offset), (24, 32, 36, 40))
        self.assertEqual([f for f, _ in _capi.A2aOptions._fields_],
                         ["struct_size", "path", "nccl_sms", "wait_timeout_s", "exchange_timeout_s", "experts", "input",
                          "scales"])
        for name in ("struct_size", "path", "nccl_sms", "wait_timeout_s"):
            self.assertEqual(getattr(_capi.A2aOptions, name).offset, getattr(_capi.Options, name).offset, name)
        self.assertEqual(ctypes.sizeof(_capi.Routing), 80)
        self.assertEqual([getattr(_capi.Routing, f).offset for f, _ in _capi.Routing._fields_],
                         [0, 8, 16, 24, 32, 40, 48, 56, 64, 72])
        self.assertEqual([f for f, _ in _capi.Routing._fields_],
                         ["struct_size", "rows", "dest_rank", "dest_token", "gate", "tokens", "send_counts",
                          "recv_counts", "on_device", "expert_counts"])
        with open(HEADER) as f:
            header = f.read()
        for struct, last in (("fo_gemm_alltoall_options", "int32_t scales;"),
                             ("fo_alltoall_routing", "const int64_t* expert_counts;")):
            body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (struct, struct), header, re.S).group(1)
            self.assertTrue(" ".join(re.sub(r"/\*.*?\*/", "", body, flags=re.S).split()).endswith(last), struct)

    def test_alltoall_options(self):
        o = _capi.make_a2a_options(self.lib)
        self.assertEqual((o.struct_size, o.path, o.nccl_sms, o.wait_timeout_s, o.exchange_timeout_s, o.experts,
                          o.input, o.scales), (48, 0, 8, 30.0, 120.0, 1, 0, 0))
        o = _capi.make_a2a_options(self.lib, input="e4m3", scales="row")
        self.assertEqual((o.input, o.scales), (1, 2))
        with self.assertRaisesRegex(InvalidArgument, "input = 'e5m2'"):
            _capi.make_a2a_options(self.lib, input="e5m2")
        o = _capi.make_a2a_options(self.lib, "slots", nccl_sms=16, wait_timeout_s=5, exchange_timeout_s=600,
                                   experts=4)
        self.assertEqual((o.path, o.nccl_sms, o.wait_timeout_s, o.exchange_timeout_s, o.experts),
                         (3, 16, 5.0, 600.0, 4))
        self.assertEqual(_capi.make_a2a_options(self.lib, experts=1).experts, 1)
        for bad, message in ((0, "experts = 0: needs experts >= 1"), (-2, "experts = -2: needs experts >= 1"),
                             (2.0, "experts = 2.0 is not an int"), (True, "experts = True is not an int")):
            with self.assertRaisesRegex(InvalidArgument, "^" + re.escape(message) + r" \(experts per rank\)$"):
                _capi.make_a2a_options(self.lib, experts=bad)
        self.assertEqual(_capi.make_a2a_options(self.lib, "sequential").path, 1)
        self.assertEqual(_capi.make_a2a_options(self.lib, "nvlink").path, 5)
        for bad in ("row_bands", "owners", "rows"):
            with self.assertRaisesRegex(InvalidArgument, f"path = '{bad}': one of 'auto', 'sequential', 'slots', "
                                                         r"'nvlink' \(GemmAllToAll's\)"):
                _capi.make_a2a_options(self.lib, bad)
        for size in (8, 31):
            with self.assertRaisesRegex(InvalidArgument, f"^fo_gemm_alltoall_options_default: struct_size = {size} "
                                        "is below 32 \\(pass sizeof \\*options\\)$"):
                self.c.fo_gemm_alltoall_options_default(ctypes.byref(_capi.A2aOptions()), size)

    def test_alltoall_values_are_checked_before_the_handle(self):
        h = ctypes.c_void_p()
        create = lambda o: self.c.fo_gemm_alltoall_create(None, 128, 128, 1, 128, 128, 0, o,  # noqa: E731
                                                          ctypes.byref(h))
        with self.assertRaisesRegex(InvalidArgument, "^fo_gemm_alltoall_create: dtype = 7 is not an fo_dtype"):
            self.c.fo_gemm_alltoall_create(None, 128, 128, 1, 128, 128, 7, None, ctypes.byref(h))
        cases = (
            ("path", 2, r"^fo_gemm_alltoall_create: options->path = 2 \(FO_PATH_ROW_BANDS\) is not a GemmAllToAll "
                        r"path \(FO_PATH_AUTO 0, FO_PATH_SEQUENTIAL 1, FO_PATH_SLOTS 3, FO_PATH_NVLINK 5\)$"),
            ("path", 4, r"options->path = 4 \(FO_PATH_OWNERS\) is not a GemmAllToAll path"),
            ("path", 9, r"options->path = 9 is not an fo_path of GemmAllToAll"),
            ("struct_size", 16, r"options->struct_size = 16 is below 32 \(fill the options with "
                                r"fo_gemm_alltoall_options_default\(&o, sizeof o\) first\)"),
        )
        for field, value, message in cases:
            with self.subTest(field=field, value=value):
                o = _capi.make_a2a_options(self.lib)
                setattr(o, field, value)
                h.value = 1234  # (garbage: must come back NULL)
                with self.assertRaisesRegex(InvalidArgument, message):
                    create(ctypes.byref(o))
                self.assertIsNone(h.value)
        for path in ("auto", "sequential", "slots"):  # (accepted: the refusal is the communicator's)
            o = _capi.make_a2a_options(self.lib, path)
            with self.assertRaisesRegex(InvalidArgument, "^fo_gemm_alltoall_create: comm is NULL$"):
                create(ctypes.byref(o))

    def test_alltoall_options_of_a_later_header(self):
        class Later(ctypes.Structure):
            _fields_ = [("o", _capi.A2aOptions), ("added", ctypes.c_int64)]

        later = Later()
        ctypes.memset(ctypes.byref(later), 0xab, ctypes.sizeof(later))
        p = ctypes.cast(ctypes.byref(later), ctypes.POINTER(_capi.A2aOptions))
        self.c.fo_gemm_alltoall_options_default(p, ctypes.sizeof(later))
        self.assertEqual((later.o.struct_size, later.o.nccl_sms, later.o.path, later.o.experts, later.added),
                         (56, 8, 0, 1, 0))
        h = ctypes.c_void_p()
        with self.assertRaisesRegex(InvalidArgument, "comm is NULL"):
            self.c.fo_gemm_alltoall_create(None, 128, 128, 1, 128, 128, 0, p, ctypes.byref(h))
        later.added = 1
        with self.assertRaisesRegex(InvalidArgument, r"options->struct_size = 56: the options set fields that this "
                                    r"library \(flashoverlap [0-9.]+, options of 48 bytes\) does not know"):
            self.c.fo_gemm_alltoall_create(None, 128, 128, 1, 128, 128, 0, p, ctypes.byref(h))

    def test_alltoall_options_of_the_first_version(self):
        # (a caller whose struct ends at exchange_timeout_s, 32 bytes: its defaults are written up to there only)
        first = _capi.A2aOptions()
        ctypes.memset(ctypes.byref(first), 0xab, ctypes.sizeof(first))
        self.c.fo_gemm_alltoall_options_default(ctypes.byref(first), 32)
        self.assertEqual((first.struct_size, first.nccl_sms, first.exchange_timeout_s), (32, 8, 120.0))
        self.assertEqual(ctypes.string_at(ctypes.addressof(first) + 32, 4), b"\xab" * 4)  # (not written)

    def test_make_routing(self):
        r, keep = _capi.make_routing(3, [0, 1, 0], [5, 2, 7], [0.5, 1.0, 0.25], 9, [2, 1], [1, 4], 2)
        self.assertEqual((r.struct_size, r.rows, r.tokens, r.on_device, bool(r.expert_counts)), (80, 3, 9, 0, False))
        self.assertEqual(([r.dest_rank[i] for i in range(3)], [r.dest_token[i] for i in range(3)],
                          [r.gate[i] for i in range(3)]), ([0, 1, 0], [5, 2, 7], [0.5, 1.0, 0.25]))
        self.assertEqual(([r.send_counts[i] for i in range(2)], [r.recv_counts[i] for i in range(2)]), ([2, 1], [1, 4]))
        r, keep = _capi.make_routing(0, [], [], None, 4, [0], [0], 1)  # (no rows, no gates: NULL)
        self.assertFalse(bool(r.gate))
        self.assertEqual((r.rows, r.tokens, r.send_counts[0]), (0, 4, 0))
        # the caller's arrays, through ctypes pointers: not copied
        ranks = (ctypes.c_int32 * 2)(1, 1)
        r, keep = _capi.make_routing(2, ctypes.cast(ranks, ctypes.POINTER(ctypes.c_int32)), [0, 1], None, 2,
                                     [0, 2], [0, 0], 2)
        self.assertEqual(ctypes.cast(r.dest_rank, ctypes.c_void_p).value, ctypes.addressof(ranks))
        # one op's slot, filled in place call after call (no ctypes objects made per call)
        slot = _capi.RoutingSlot(2)
        for rows, send in ((3, [2, 1]), (5, [0, 5])):
            r = slot.fill(rows, ctypes.cast(ranks, ctypes.POINTER(ctypes.c_int32)), None, None, 7, send, [1, 4])
            self.assertIs(r, slot.r)
            self.assertEqual((r.rows, r.tokens, r.on_device, bool(r.gate), [r.send_counts[i] for i in range(2)],
                              [r.recv_counts[i] for i in range(2)]), (rows, 7, 0, False, send, [1, 4]))
        self.assertEqual(slot.fill(0, None, None, None, 0, [0, 0], [0, 0], on_device=True).on_device, 1)
        with self.assertRaisesRegex(InvalidArgument, "send_counts and recv_counts need 2 entries, not 1 and 2"):
            slot.fill(1, None, None, None, 1, [1], [0, 1])
        self.assertFalse(bool(slot.r.expert_counts))  # (one expert per rank: NULL)
        with self.assertRaisesRegex(InvalidArgument, "expert_counts is for several experts per rank"):
            slot.fill(3, None, None, None, 7, [2, 1], [1, 4], expert_counts=[2, 1])
        # device arrays: their addresses as pointers, and on_device set
        at = lambda v: ctypes.cast(ctypes.c_void_p(v), ctypes.POINTER(ctypes.c_int32))  # noqa: E731
        r, keep = _capi.make_routing(2, at(0x7000), at(0x8000), ctypes.cast(ctypes.c_void_p(0x9000),
                                     ctypes.POINTER(ctypes.c_float)), 2, [2], [2], 1, on_device=True)
        self.assertEqual((r.on_device, ctypes.cast(r.dest_rank, ctypes.c_void_p).value,
                          ctypes.cast(r.dest_token, ctypes.c_void_p).value, ctypes.cast(r.gate, ctypes.c_void_p).value),
                         (1, 0x7000, 0x8000, 0x9000))
        # several experts per rank: expert_counts, world * experts entries, s-major; NULL unless given
        r, keep = _capi.make_routing(3, [0, 1, 0], [5, 2, 7], None, 9, [2, 1], [1, 4], 2,
                                     expert_counts=[1, 0, 1, 0, 1, 0], experts=3)
        self.assertEqual([r.expert_counts[i] for i in range(6)], [1, 0, 1, 0, 1, 0])
        with self.assertRaisesRegex(InvalidArgument, "^expert_counts has 4 entries, expected 6$"):
            _capi.make_routing(3, [0, 1, 0], [5, 2, 7], None, 9, [2, 1], [1, 4], 2, expert_counts=[1, 1, 1, 0],
                               experts=3)
        slot = _capi.RoutingSlot(2, experts=2)
        for counts in ([2, 0, 0, 1], [1, 1, 0, 1]):
            r = slot.fill(3, None, None, None, 7, [2, 1], [1, 4], expert_counts=counts)
            self.assertIs(r, slot.r)
            self.assertEqual((r.struct_size, [r.expert_counts[i] for i in range(4)]), (80, counts))
            self.assertEqual(ctypes.cast(r.expert_counts, ctypes.c_void_p).value, ctypes.addressof(slot.expert))
        for bad, got in ((None, "none"), ([2, 1], "2")):
            with self.assertRaisesRegex(InvalidArgument, "^" + re.escape(f"expert_counts needs 4 entries (world 2 x 2 "
                                                                         f"experts), not {got}") + "$"):
                slot.fill(3, None, None, None, 7, [2, 1], [1, 4], expert_counts=bad)
        for args, message in (((2, [0], [0, 1], None, 2, [2], [2], 1), "dest_rank has 1 entries, expected 2"),
                              ((1, [0], [0], [1.0, 2.0], 2, [1], [1], 1), "gate has 2 entries, expected 1"),
                              ((1, [0], [0], None, 2, [1], [1, 0], 1), "recv_counts has 2 entries, expected 1"),
                              ((1, [0], [0], None, 2, 1, [1], 1), "send_counts must be a sequence of 1 numbers, not int")):
            with self.assertRaisesRegex(InvalidArgument, "^" + re.escape(message) + "$"):
                _capi.make_routing(*args)

    def test_alltoall_methods_pass_their_arguments(self):
        calls = []
        record = lambda name: lambda *args: calls.append((name,) + args)  # noqa: E731
        lib = types.SimpleNamespace(c=types.SimpleNamespace(
            fo_gemm_alltoall_run=record("run"), fo_gemm_alltoall_check=record("check")))
        op = object.__new__(_capi.GemmAllToAll)
        _capi._Handle.__init__(op, lib, ctypes.c_void_p(0x1234))
        r, keep = _capi.make_routing(1, [0], [0], [1.0], 1, [1], [1], 1)
        op.run(0x10, 0x20, r, 0x30, 0, True, None, 0x40)
        op.run(0, 0, r, 0x30, 512, False, 0x50)  # (no rows: a and b NULL; the legacy default stream)
        op.check()
        (n0, h0, a0, b0, r0, o0, ld0, c0, t0, s0), (n1, h1, a1, b1, r1, o1, ld1, c1, t1, s1), (n2, h2) = calls
        self.assertEqual((n0, h0.value, a0, b0, o0, ld0, c0, t0, s0), ("run", 0x1234, 0x10, 0x20, 0x30, 0, 1, None, 0x40))
        self.assertEqual((a1, b1, o1, ld1, c1, s1), (None, None, 0x30, 512, 0, None))
        self.assertEqual(ctypes.cast(t1, ctypes.c_void_p).value, 0x50)
        self.assertEqual(ctypes.cast(r0, ctypes.c_void_p).value, ctypes.addressof(r))  # (byref(routing))
        self.assertEqual((n2, h2.value), ("check", 0x1234))
        op._handle = None  # (nothing to destroy)

    def test_alltoall_ctypes_class_checks_its_arguments_first(self):
        closed = _capi.Communicator(self.lib, ctypes.c_void_p())
        with self.assertRaisesRegex(InvalidArgument, "path = 'owners'"):
            _capi.GemmAllToAll(closed, 128, 128, 1, 128, 128, "bf16", path="owners")
        with self.assertRaisesRegex(InvalidArgument, "dtype = 'fp32': bf16 or fp16"):
            _capi.GemmAllToAll(closed, 128, 128, 1, 128, 128, "fp32")
        with self.assertRaisesRegex(FlashOverlapError, "this Communicator is closed"):
            _capi.GemmAllToAll(closed, 128, 128, 1, 128, 128, "bf16", path="slots")

    def test_dtype_codes(self):
        self.assertEqual([_capi.dtype_code(d) for d in ("bf16", "BFloat16", "fp16", "float16", 0, 1)], [0, 0, 1, 1, 0, 1])
        for bad in ("fp32", 2, True, None):
            with self.assertRaisesRegex(InvalidArgument, "bf16 or fp16"):
                _capi.dtype_code(bad)

    def test_unique_id(self):
        a, b = _capi.unique_id(), _capi.unique_id()
        self.assertEqual((len(a), len(b)), (128, 128))
        self.assertNotEqual(a, b)

    def test_communicator_arguments(self):
        uid = _capi.unique_id()
        with self.assertRaisesRegex(InvalidArgument, "id_size = 5, not FO_UNIQUE_ID_BYTES"):
            _capi.Communicator.from_unique_id(b"12345", 0, 1)
        with self.assertRaisesRegex(InvalidArgument, "rank = 2, world = 2: needs world >= 1 and 0 <= rank < world"):
            _capi.Communicator.from_unique_id(uid, 2, 2)

    def test_no_gpu(self):
        if self.gpu:
            self.skipTest("this machine has a usable GPU")
        for make in (_capi.Communicator.from_env, lambda: _capi.Communicator.from_unique_id(_capi.unique_id(), 0, 1)):
            with self.assertRaises(NoGpu) as cm:
                make()
            self.assertRegex(str(cm.exception), r"^fo_comm_from_(env|unique_id): .*no usable Hopper \(sm_90\) GPU")
            self.assertEqual(cm.exception.status, flashoverlap.FO_NO_GPU)
        # (a GemmReduceScatter or GemmAllToAll, as a GemmAllReduce, is built on a communicator: its refusal is
        # that one's)
        with self.assertRaises(NoGpu) as cm:
            _capi.GemmReduceScatter(_capi.Communicator.from_env(), 128, 128, 128, "bf16")
        self.assertRegex(str(cm.exception), r"^fo_comm_from_env: .*no usable Hopper \(sm_90\) GPU: .*(driver|device)")
        with self.assertRaises(NoGpu) as cm:
            _capi.GemmAllToAll(_capi.Communicator.from_env(), 128, 128, 1, 128, 128, "bf16")
        self.assertRegex(str(cm.exception), r"^fo_comm_from_env: .*no usable Hopper \(sm_90\) GPU")

    def test_closed_handles(self):
        comm = _capi.Communicator(self.lib, ctypes.c_void_p())
        with self.assertRaisesRegex(FlashOverlapError, "this Communicator is closed"):
            comm.rank
        comm.close()  # (twice: nothing)
        op = object.__new__(_capi.GemmReduceScatter)
        _capi._Handle.__init__(op, self.lib, ctypes.c_void_p())
        for call in (lambda: op.rows_out(128), lambda: op.rows(128), lambda: op.plan(128), op.check, op.shape,
                     lambda: op.all_gather_rows(0x10, 0x20, 128)):
            with self.assertRaisesRegex(FlashOverlapError, "this GemmReduceScatter is closed"):
                call()
        op.close()
        op = object.__new__(_capi.GemmAllToAll)
        _capi._Handle.__init__(op, self.lib, ctypes.c_void_p())
        r, keep = _capi.make_routing(0, [], [], None, 0, [0], [0], 1)
        for call in (lambda: op.run(0, 0, r, 0), op.last_plan, op.check, op.shape):
            with self.assertRaisesRegex(FlashOverlapError, "this GemmAllToAll is closed"):
                call()
        op.close()

    def test_nccl(self):
        v = self.lib.nccl_version()
        self.assertGreaterEqual(v[:2], _capi.NCCL_MIN)
        self.lib.check_nccl()
        self.assertTrue(os.path.basename(self.lib.nccl_file() or "libnccl.so.2").startswith("libnccl"))
        self.assertIn(self.lib.nccl_file() or "", _capi.mapped_nccl_files() + [""])
        self.assertEqual(_capi.decode_nccl_version(22809), (2, 28, 9))
        self.assertEqual(_capi.decode_nccl_version(2804), (2, 8, 4))
        _capi.check_nccl_version((2, 29, 1))
        for old in ((2, 27, 3), (2, 21, 5), (3, 0, 0)):
            with self.assertRaisesRegex(FlashOverlapError, r"runs on NCCL 2\.28 and later 2\.x, but this process runs NCCL "
                                        + re.escape(".".join(map(str, old)))):
                _capi.check_nccl_version(old)

    def test_shares_nccl_with(self):
        self.assertEqual(self.lib.shares_nccl_with(self.lib.path), (True, ""))
        same, why = self.lib.shares_nccl_with("libc.so.6")
        self.assertFalse(same)
        self.assertIn("no NCCL of its own", why)


class RsRows(unittest.TestCase):
    """flashoverlap.torch.rs_rows and rs_rows_out (no torch needed for ints):
    what the ReduceScatter's fake implementations allocate by, and what the
    GPU tests compare the library's rows with."""

    @classmethod
    def setUpClass(cls):
        import flashoverlap.torch as fot
        cls.fot = fot

    def test_examples(self):
        rows, count = self.fot.rs_rows, self.fot.rs_rows_out
        self.assertEqual(rows(8, 2, 1, "standard"), [4, 5, 6, 7])
        self.assertEqual(rows(6, 1, 0, "standard"), list(range(6)))
        self.assertEqual(rows(200, 2, 0, "subtile"), list(range(0, 64)) + list(range(128, 192)))
        self.assertEqual(rows(200, 2, 1, "subtile"), list(range(64, 128)) + list(range(192, 200)))
        self.assertEqual(rows(20, 4, 1, "subtile"), [])  # (32 rows a rank of each tile row: rank 0 has all 20)
        self.assertEqual(rows(20, 4, 0, "subtile"), list(range(20)))
        self.assertEqual([count(200, 2, r, "subtile") for r in (0, 1)], [128, 72])
        self.assertEqual([count(130, 8, r, "subtile") for r in range(8)], [18] + [16] * 7)
        self.assertEqual(count(0, 2, 1, "subtile"), 0)
        self.assertEqual(count(0, 2, 1, "standard"), 0)
        self.assertEqual(count(384, 128, 127, "subtile"), 3)

    def test_every_row_once_over_the_ranks(self):
        for world in (1, 2, 4, 8):
            for layout in ("standard", "subtile"):
                for m in range(0, 700, world if layout == "standard" else 1):
                    per_rank = [self.fot.rs_rows(m, world, r, layout) for r in range(world)]
                    for r, rows in enumerate(per_rank):
                        self.assertEqual(len(rows), self.fot.rs_rows_out(m, world, r, layout), (world, layout, m, r))
                        self.assertEqual(rows, sorted(rows))
                    self.assertEqual(sorted(sum(per_rank, [])), list(range(m)), (world, layout, m))


class CustomOps(unittest.TestCase):
    """flashoverlap.torch's custom ops as torch.library is given them (a
    stand-in library here: torch >= 2.4 is on the GPU machine only): every
    op's name and schema, the real implementations reaching the op of the
    handle, the fakes' shapes."""

    SCHEMAS = {
        "gemm_all_reduce": "(Tensor x, Tensor weight, int handle) -> Tensor",
        "gemm_all_reduce_rmsnorm": "(Tensor x, Tensor weight, Tensor residual, Tensor norm_weight, float eps, "
                                   "int handle) -> (Tensor, Tensor)",
        "gemm_reduce_scatter": "(Tensor x, Tensor weight, int handle) -> Tensor",
        "gemm_reduce_scatter_rmsnorm": "(Tensor x, Tensor weight, Tensor residual, Tensor norm_weight, float eps, "
                                       "int handle) -> (Tensor, Tensor)",
        "gemm_reduce_scatter_all_gather_rows": "(Tensor y, SymInt m, int handle) -> Tensor",
        "gemm_all_to_all": "(Tensor x, Tensor weight, Tensor dest_rank, Tensor dest_token, Tensor gate, "
                           "SymInt[] send_counts, SymInt[] recv_counts, SymInt tokens, int handle, "
                           "SymInt[]? expert_counts=None, Tensor? scale_a=None, Tensor? scale_b=None) -> Tensor",
        "gemm_all_to_all_rows": "(Tensor x, Tensor weight, Tensor dest_rank, Tensor dest_token, Tensor? gate, "
                                "SymInt[] send_counts, SymInt[] recv_counts, SymInt tokens, int handle, "
                                "SymInt[]? expert_counts=None, Tensor? scale_a=None, Tensor? scale_b=None) -> "
                                "(Tensor, Tensor)",
        "gemm_all_reduce_scaled": "(Tensor x, Tensor weight, Tensor? scale_a, Tensor? scale_b, int handle) -> Tensor",
        "gemm_all_reduce_rmsnorm_scaled": "(Tensor x, Tensor weight, Tensor residual, Tensor norm_weight, float eps, "
                                          "Tensor? scale_a, Tensor? scale_b, int handle) -> (Tensor, Tensor)",
        "gemm_reduce_scatter_scaled": "(Tensor x, Tensor weight, Tensor? scale_a, Tensor? scale_b, int handle) -> "
                                      "Tensor",
        "gemm_reduce_scatter_rmsnorm_scaled": "(Tensor x, Tensor weight, Tensor residual, Tensor norm_weight, "
                                              "float eps, Tensor? scale_a, Tensor? scale_b, int handle) -> "
                                              "(Tensor, Tensor)",
    }

    @classmethod
    def setUpClass(cls):
        import flashoverlap.torch as fot
        from flashoverlap import _custom_ops
        cls.fot, cls.defined = fot, {}

        class Defined:
            def __init__(self, schema, real):
                self.schema, self.real, self.fake = schema, real, None

            def register_fake(self, fake):
                self.fake = fake
                return fake

        def custom_op(name, mutates_args, schema):
            assert mutates_args == () and name not in cls.defined, name
            return lambda real: cls.defined.setdefault(name, Defined(schema, real))

        _custom_ops.register(types.SimpleNamespace(library=types.SimpleNamespace(custom_op=custom_op)))

    def test_names_and_schemas(self):
        self.assertEqual({n: d.schema for n, d in self.defined.items()},
                         {"flashoverlap::" + n: s for n, s in self.SCHEMAS.items()})
        self.assertTrue(all(d.fake is not None for d in self.defined.values()))
        # (a schema argument with a default may be left out by the caller: the functions default it alike)
        import inspect
        for name in ("gemm_all_to_all", "gemm_all_to_all_rows"):
            for fn in (self.defined["flashoverlap::" + name].real, self.defined["flashoverlap::" + name].fake):
                params = list(inspect.signature(fn).parameters.values())
                self.assertEqual([(p.name, p.default) for p in params[-4:]],
                                 [("handle", inspect.Parameter.empty), ("expert_counts", None), ("scale_a", None),
                                  ("scale_b", None)], fn.__name__)
        try:
            import torch
        except ImportError:
            return
        if hasattr(torch._C, "parse_schema"):  # (the schemas parse as torch reads them)
            for name, schema in self.SCHEMAS.items():
                torch._C.parse_schema(f"flashoverlap::{name}{schema}")

    def test_real_implementations_reach_the_op_of_the_handle(self):
        fot, seen = self.fot, []
        record = lambda name: lambda *args: seen.append((name,) + args) or (name, "second")  # noqa: E731
        made = []
        for cls, methods in ((fot.GemmAllReduce, ("_run", "_run_rmsnorm", "_run_fp8")),
                             (fot.GemmReduceScatter, ("_run", "_run_rmsnorm", "_all_gather_rows", "_run_fp8")),
                             (fot.GemmAllToAll, ("_run",))):
            op = object.__new__(cls)
            for m in methods:
                setattr(op, m, record(f"{cls.__name__}.{m}"))
            op.handle = 987000 + len(made)
            fot._ops[op.handle] = op
            made.append(op)
        self.addCleanup(lambda: [fot._ops.pop(op.handle, None) for op in made])
        ar, rs, a2a = (op.handle for op in made)
        call = lambda name, *args: self.defined["flashoverlap::" + name].real(*args)  # noqa: E731
        call("gemm_all_reduce", "x", "w", ar)
        call("gemm_all_reduce_rmsnorm", "x", "w", "r", "g", 1e-6, ar)
        call("gemm_reduce_scatter", "x", "w", rs)
        call("gemm_reduce_scatter_rmsnorm", "x", "w", "r", "g", 1e-5, rs)
        call("gemm_reduce_scatter_all_gather_rows", "y", 64, rs)
        self.assertEqual(call("gemm_all_to_all", "x", "w", "dr", "dt", "g", [1], [2], 3, a2a), "GemmAllToAll._run")
        self.assertEqual(call("gemm_all_to_all_rows", "x", "w", "dr", "dt", None, [1], [2], 3, a2a),
                         ("GemmAllToAll._run", "second"))
        # (several experts per rank: expert_counts after the handle)
        call("gemm_all_to_all", "x", "w", "dr", "dt", "g", [1], [2], 3, a2a, [1, 0])
        call("gemm_all_to_all_rows", "x", "w", "dr", "dt", None, [1], [2], 3, a2a, [0, 1])
        # (FP8 inputs' scales after expert_counts, to _run as a pair)
        call("gemm_all_to_all", "x", "w", "dr", "dt", "g", [1], [2], 3, a2a, None, "sa", "sb")
        self.assertEqual(seen.pop(), ("GemmAllToAll._run", "x", "w", "dr", "dt", "g", [1], [2], 3, True, None,
                                      ("sa", "sb")))
        # (FP8: the op's checked call, run directly: not dispatched to the custom op again)
        call("gemm_all_reduce_scaled", "x", "w", "sa", "sb", ar)
        call("gemm_reduce_scatter_rmsnorm_scaled", "x", "w", "r", "g", 1e-5, "sa", "sb", rs)
        self.assertEqual(seen[-2:], [
            ("GemmAllReduce._run_fp8", "x", "w", None, None, 1e-6, "sa", "sb"),
            ("GemmReduceScatter._run_fp8", "x", "w", "r", "g", 1e-5, "sa", "sb")])
        del seen[-2:]
        self.assertEqual(seen, [
            ("GemmAllReduce._run", "x", "w"), ("GemmAllReduce._run_rmsnorm", "x", "w", "r", "g", 1e-6),
            ("GemmReduceScatter._run", "x", "w"), ("GemmReduceScatter._run_rmsnorm", "x", "w", "r", "g", 1e-5),
            ("GemmReduceScatter._all_gather_rows", "y", 64),
            ("GemmAllToAll._run", "x", "w", "dr", "dt", "g", [1], [2], 3, True, None, None),
            ("GemmAllToAll._run", "x", "w", "dr", "dt", None, [1], [2], 3, False, None, None),
            ("GemmAllToAll._run", "x", "w", "dr", "dt", "g", [1], [2], 3, True, [1, 0], None),
            ("GemmAllToAll._run", "x", "w", "dr", "dt", None, [1], [2], 3, False, [0, 1], None)])
        # a handle of another kind, or none
        with self.assertRaisesRegex(FlashOverlapError, f"handle {ar} is a GemmAllReduce, not a GemmReduceScatter"):
            call("gemm_reduce_scatter", "x", "w", ar)
        with self.assertRaisesRegex(FlashOverlapError, "no op with handle 986999"):
            call("gemm_all_reduce", "x", "w", 986999)

    def test_fakes_say_the_shapes(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed: the fakes' shapes are not tested")
        fot = self.fot
        fake = lambda name, *args: self.defined["flashoverlap::" + name].fake(*args)  # noqa: E731
        x, w = torch.zeros(6, 16, dtype=torch.float16), torch.zeros(32, 16, dtype=torch.float16)
        r = torch.zeros(6, 32, dtype=torch.float16)
        # the AllReduce's shape needs no op: an unknown handle is no error for its fakes
        self.assertEqual(tuple(fake("gemm_all_reduce", x, w, 986999).shape), (6, 32))
        self.assertEqual([tuple(t.shape) for t in fake("gemm_all_reduce_rmsnorm", x, w, r, r[0], 1e-6, 986999)],
                         [(6, 32), (6, 32)])
        rs = object.__new__(fot.GemmReduceScatter)
        rs.max_m, rs.n, rs.k, rs.dtype, rs.device = 64, 32, 16, torch.float16, torch.device("cpu")
        rs.world, rs.rank, rs.layout, rs.handle = 2, 1, "standard", 987100
        fot._ops[rs.handle] = rs
        self.addCleanup(fot._ops.pop, rs.handle, None)
        self.assertEqual(tuple(fake("gemm_reduce_scatter", x, w, rs.handle).shape), (3, 32))
        self.assertEqual(tuple(fake("gemm_reduce_scatter_all_gather_rows", r[:3], 6, rs.handle).shape), (6, 32))
        with self.assertRaisesRegex(FlashOverlapError, "no op with handle 986999"):
            fake("gemm_reduce_scatter", x, w, 986999)

    def a2a_op(self, torch, experts, handle):
        """A GemmAllToAll's attributes (world 2, n 32, k 16, fp16 on the CPU), published under handle."""
        fot = self.fot
        op = object.__new__(fot.GemmAllToAll)
        op.max_rows, op.max_tokens, op.topk, op.n, op.k, op.experts = 64, 32, 2 * experts, 32, 16, experts
        op.dtype, op.device, op.world, op.rank, op.handle = torch.float16, torch.device("cpu"), 2, 0, handle
        fot._ops[handle] = op
        self.addCleanup(fot._ops.pop, handle, None)
        return op

    def test_alltoall_fakes_say_the_shapes_with_several_experts(self):
        # (the outputs' shapes are those of one expert: (tokens, n) combined, (sum(recv_counts), n) and its
        # tokens not; the weight is (experts, n, k) and expert_counts are checked first, under FakeTensorMode too)
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed: the fakes' shapes are not tested")
        fake = lambda name, *args: self.defined["flashoverlap::" + name].fake(*args)  # noqa: E731
        one, three = self.a2a_op(torch, 1, 987201), self.a2a_op(torch, 3, 987203)
        h = torch.float16

        def args(rows, w, send, recv):
            return (torch.zeros(rows, 16, dtype=h), w, torch.zeros(rows, dtype=torch.int32),
                    torch.zeros(rows, dtype=torch.int32), torch.ones(rows), send, recv, 7)

        w1, w3 = torch.zeros(32, 16, dtype=h), torch.zeros(3, 32, 16, dtype=h)
        self.assertEqual(tuple(fake("gemm_all_to_all", *args(5, w1, [3, 2], [4, 1]), one.handle).shape), (7, 32))
        self.assertEqual(tuple(fake("gemm_all_to_all", *args(5, w1[None], [3, 2], [4, 1]), one.handle).shape),
                         (7, 32))
        counts = [1, 0, 2, 0, 2, 0]  # (rank 0's three experts: 3 rows; rank 1's: 2)
        self.assertEqual(tuple(fake("gemm_all_to_all", *args(5, w3, [3, 2], [4, 1]), three.handle, counts).shape),
                         (7, 32))
        rows, tok = fake("gemm_all_to_all_rows", *args(5, w3, [3, 2], [4, 6]), three.handle, counts)
        self.assertEqual((tuple(rows.shape), tuple(tok.shape), tok.dtype), ((10, 32), (10,), torch.int32))
        for name, a, handle, message in (
                ("gemm_all_to_all", args(5, w1, [3, 2], [4, 1]), three.handle,
                 "weight has shape (32, 16), expected (3, 32, 16): the 3 experts' weights stacked (experts, n, k)"),
                ("gemm_all_to_all", args(5, w3, [3, 2], [4, 1]), three.handle, "expert_counts is required with 3 "
                 "experts per rank"),
                ("gemm_all_to_all_rows", args(5, w3, [3, 2], [4, 1]), three.handle, "expert_counts is required"),
                ("gemm_all_to_all", args(5, w3, [3, 2], [4, 1]), one.handle, "weight has shape (3, 32, 16), expected "
                 "(1, 32, 16)"),
                ("gemm_all_to_all", args(5, w1, [3, 2], [4, 1]) + (one.handle, [3, 2]), None,
                 "expert_counts is for several experts per rank; this op has one")):
            extra = () if handle is None else (handle,)
            with self.assertRaises(InvalidArgument) as cm:
                fake(name, *a, *extra)
            self.assertIn(message, str(cm.exception))
        with self.assertRaisesRegex(InvalidArgument, r"expert_counts has 5 entries, expected world x experts = 2 x 3 "
                                                     "= 6 ints"):
            fake("gemm_all_to_all", *args(5, w3, [3, 2], [4, 1]), three.handle, counts[:5])
        try:
            from torch._subclasses.fake_tensor import FakeTensorMode
        except ImportError:
            return
        with FakeTensorMode():
            rows, tok = fake("gemm_all_to_all_rows", *args(5, torch.empty(3, 32, 16, dtype=h), [3, 2], [4, 6]),
                             three.handle, counts)
        self.assertEqual((tuple(rows.shape), tuple(tok.shape)), ((10, 32), (10,)))


@unittest.skipUnless(shutil.which("cc") and shutil.which("nm"), "no C compiler or nm: no stand-in NCCL")
class OlderNccl(unittest.TestCase):
    """A libnccl.so.2 older than 2.28 loaded first (as torch loads its own)
    is named, whether it lacks the library's symbols or only says 2.27."""

    def fake_nccl(self, directory, version, symbols):
        src = os.path.join(directory, "nccl.c")
        with open(src, "w") as f:
            f.write(f"int ncclGetVersion(int* v) {{ *v = {version}; return 0; }}\n")
            f.writelines(f"int {s}(void) {{ return 1; }}\n" for s in symbols if s != "ncclGetVersion")
        lib = os.path.join(directory, "libnccl.so.2")
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", lib, src], check=True)
        return lib

    def child(self, lib, code):
        return run_python(f"import ctypes\nctypes.CDLL({lib!r})\nimport flashoverlap\nfrom flashoverlap import _capi\n"
                          + code, FLASHOVERLAP_LIBRARY=flashoverlap.load().path)

    def test_missing_symbols_are_named_at_load(self):
        with tempfile.TemporaryDirectory() as d:
            lib = self.fake_nccl(d, 22703, [])
            out = self.child(lib, "try:\n    flashoverlap.load()\nexcept flashoverlap.FlashOverlapError as e:\n"
                                  "    print(e)\n")
        self.assertRegex(out, r"^cannot load .*undefined symbol: nccl\w+; the process's NCCL: .*libnccl.so.2 "
                              r"\(NCCL 2\.27\.3\) \(flashoverlap needs NCCL >= 2\.28\)")

    def test_an_older_version_is_refused_when_a_communicator_is_made(self):
        nm = subprocess.run(["nm", "-D", "--undefined-only", flashoverlap.load().path], capture_output=True, text=True,
                            check=True).stdout
        symbols = sorted(set(re.findall(r"\bU (nccl\w+)", nm)))
        self.assertIn("ncclGetVersion", symbols)
        with tempfile.TemporaryDirectory() as d:
            lib = self.fake_nccl(d, 22703, symbols)
            out = self.child(lib, "print(flashoverlap.nccl_version())\ntry:\n    _capi.Communicator.from_env()\n"
                                  "except flashoverlap.FlashOverlapError as e:\n    print(type(e).__name__, e)\n")
        lines = out.splitlines()
        self.assertEqual(lines[0], "(2, 27, 3)")
        self.assertRegex(lines[1], r"^FlashOverlapError flashoverlap runs on NCCL 2\.28 and later 2\.x, but this "
                                   r"process runs NCCL 2\.27\.3 \(.*libnccl.so.2\)")


@unittest.skipIf(os.environ.get("FO_TEST_INSTALLED") or not os.path.isfile(os.path.join(REPO, "python", "_build_backend.py")),
                 "the build backend is tested from the source tree")
class PythonExample(unittest.TestCase):
    """examples/python/tp_linear.py where it cannot run: one line and an exit code, no traceback."""

    EXAMPLE = os.path.join(REPO, "examples", "python", "tp_linear.py")

    def run_example(self, pythonpath, block_torch=False):
        e = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=pythonpath, CUDA_VISIBLE_DEVICES="")
        code = (BLOCK_TORCH if block_torch else "") + f"import runpy; runpy.run_path({self.EXAMPLE!r}, run_name='__main__')"
        return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)

    def test_without_torch(self):
        r = self.run_example(os.path.dirname(os.path.dirname(flashoverlap.__file__)), block_torch=True)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertRegex(r.stderr, r"^tp_linear: needs PyTorch with CUDA")
        self.assertNotIn("Traceback", r.stderr)

    @unittest.skipUnless(HAVE_TORCH, "no torch in this interpreter")
    def test_without_the_package(self):
        r = self.run_example(tempfile.gettempdir())
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertRegex(r.stderr, r"^tp_linear: needs the flashoverlap package")
        self.assertNotIn("Traceback", r.stderr)

    @unittest.skipUnless(HAVE_TORCH, "no torch in this interpreter")
    def test_without_a_gpu(self):
        r = self.run_example(os.path.dirname(os.path.dirname(flashoverlap.__file__)))
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "tp_linear: no CUDA GPU: nothing to run"), r.stderr)


class Wheel(unittest.TestCase):
    def setUp(self):
        sys.path.insert(0, os.path.join(REPO, "python"))
        self.addCleanup(sys.path.remove, os.path.join(REPO, "python"))
        import _build_backend
        self.backend = _build_backend

    def test_wheel_bundles_the_library(self):
        lib = flashoverlap.load().path
        saved = os.environ.get(flashoverlap.LIBRARY_ENV)
        os.environ[flashoverlap.LIBRARY_ENV] = lib
        try:
            with tempfile.TemporaryDirectory() as d:
                name = self.backend.build_wheel(d)
                self.assertRegex(name, rf"^flashoverlap-{re.escape(project_version())}-py3-none-\w+\.whl$")
                with zipfile.ZipFile(os.path.join(d, name)) as z:
                    names = set(z.namelist())
                    for f in ("flashoverlap/__init__.py", "flashoverlap/_capi.py", "flashoverlap/torch.py",
                              "flashoverlap/lib/libflashoverlap.so"):
                        self.assertIn(f, names)
                    with open(lib, "rb") as f:
                        self.assertEqual(z.read("flashoverlap/lib/libflashoverlap.so"), f.read())
                    self.assertEqual(z.getinfo("flashoverlap/lib/libflashoverlap.so").external_attr >> 16 & 0o777, 0o755)
                    info = f"flashoverlap-{project_version()}.dist-info"
                    self.assertIn(f"Version: {project_version()}\n", z.read(f"{info}/METADATA").decode())
                    record = z.read(f"{info}/RECORD").decode().splitlines()
                    self.assertEqual(len(record), len(names))
                    for line in record:
                        path, digest, size = line.rsplit(",", 2)
                        if path.endswith("RECORD"):
                            continue
                        data = z.read(path)
                        want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                        self.assertEqual((digest, int(size)), (f"sha256={want}", len(data)), path)
                    self.assertFalse(any("__pycache__" in n for n in names))
        finally:
            if saved is None:
                os.environ.pop(flashoverlap.LIBRARY_ENV)
            else:
                os.environ[flashoverlap.LIBRARY_ENV] = saved

    def test_missing_library_is_named(self):
        saved = os.environ.get(flashoverlap.LIBRARY_ENV)
        os.environ[flashoverlap.LIBRARY_ENV] = "/nonexistent.so"
        try:
            with tempfile.TemporaryDirectory() as d, self.assertRaisesRegex(RuntimeError, "/nonexistent.so: no such"):
                self.backend.build_wheel(d)
        finally:
            if saved is None:
                os.environ.pop(flashoverlap.LIBRARY_ENV)
            else:
                os.environ[flashoverlap.LIBRARY_ENV] = saved

    def test_sdist(self):
        with tempfile.TemporaryDirectory() as d:
            import tarfile
            name = self.backend.build_sdist(d)
            with tarfile.open(os.path.join(d, name)) as t:
                names = t.getnames()
            base = f"flashoverlap-{project_version()}"
            for f in ("pyproject.toml", "_build_backend.py", "PKG-INFO", "flashoverlap/torch.py"):
                self.assertIn(f"{base}/{f}", names)


@unittest.skipUnless(HAVE_TORCH, "torch is not installed: the tensor validation is not tested")
class TorchValidation(unittest.TestCase):
    """What flashoverlap.torch checks before any GPU work (any torch >= 1.13)."""

    @classmethod
    def setUpClass(cls):
        import torch
        import flashoverlap.torch as fot
        cls.torch, cls.fot = torch, fot
        cls.new_torch = fot.torch_version(torch) >= fot.MIN_TORCH

    class Spec:
        def __init__(self, torch, device="cpu"):
            self.max_m, self.n, self.k, self.dtype, self.device = 64, 32, 16, torch.float16, torch.device(device)

        def __str__(self):
            return "GemmAllReduce(max_m=64, n=32, k=16, float16, cpu)"

    class RsSpec(Spec):
        def __init__(self, torch, world=2, rank=1, layout="standard"):
            super().__init__(torch)
            self.world, self.rank, self.layout = world, rank, layout

        def __str__(self):
            return f"GemmReduceScatter(max_m=64, n=32, k=16, float16, cpu, world {self.world}, {self.layout} layout)"

    class A2aSpec(Spec):
        def __init__(self, torch, world=2, experts=1):
            super().__init__(torch)
            self.world, self.max_rows, self.max_tokens, self.topk, self.experts = world, 64, 32, 2, experts

        def __str__(self):
            experts = f"experts={self.experts}, " if self.experts > 1 else ""
            return (f"GemmAllToAll(max_rows=64, max_tokens=32, topk=2, {experts}n=32, k=16, float16, cpu, "
                    f"world {self.world})")

    def rs_check_fails(self, spec, message, x, w, r=None, g=None):
        with self.assertRaises(InvalidArgument) as cm:
            self.fot.check_rs_inputs(spec, x, w, r, g)
        self.assertEqual(str(cm.exception), f"{spec}: " + message)
        self.assertIsInstance(cm.exception, ValueError)

    def check_fails(self, message, x, w, r=None, g=None):
        with self.assertRaises(InvalidArgument) as cm:
            self.fot.check_inputs(self.Spec(self.torch), x, w, r, g)
        self.assertEqual(str(cm.exception), "GemmAllReduce(max_m=64, n=32, k=16, float16, cpu): " + message)
        self.assertIsInstance(cm.exception, ValueError)

    def test_messages_name_the_problem(self):
        t = self.torch
        h = t.float16
        x, w, r, g = t.zeros(8, 16, dtype=h), t.zeros(32, 16, dtype=h), t.zeros(8, 32, dtype=h), t.zeros(32, dtype=h)
        self.fot.check_inputs(self.Spec(t), x, w)
        self.fot.check_inputs(self.Spec(t), x, w, r, g)
        self.fot.check_inputs(self.Spec(t), t.zeros(64, 16, dtype=h), w)
        self.check_fails("x must be a torch.Tensor, not list", [1.0], w)
        self.check_fails("x has dtype torch.float32, expected torch.float16", x.float(), w)
        self.check_fails("weight has dtype torch.bfloat16, expected torch.float16", x, w.bfloat16())
        self.check_fails("x is on meta, expected cpu", t.zeros(8, 16, dtype=h, device="meta"), w)
        self.check_fails("x has 1 dimensions (shape (16,), strides (1,)), expected 2", t.zeros(16, dtype=h), w)
        self.check_fails("x has shape (8, 8), expected (m, 16)", t.zeros(8, 8, dtype=h), w)
        self.check_fails("weight has shape (32, 8), expected (32, 16)", x, t.zeros(32, 8, dtype=h))
        self.check_fails("weight has shape (16, 16), expected (32, 16)", x, t.zeros(16, 16, dtype=h))
        self.check_fails("x is not contiguous (shape (8, 16), strides (1, 8)): the op reads row-major rows; "
                         "pass x.contiguous()", t.zeros(16, 8, dtype=h).t(), w)
        self.check_fails("weight is not contiguous (shape (32, 16), strides (1, 32)): the op reads row-major rows; "
                         "pass weight.contiguous()", x, t.zeros(16, 32, dtype=h).t())
        self.check_fails("x has m = 65 rows, more than the op's max_m = 64 (build the op with a larger max_m)",
                         t.zeros(65, 16, dtype=h), w)
        self.check_fails("residual has shape (9, 32), expected (8, 32)", x, w, t.zeros(9, 32, dtype=h), g)
        self.check_fails("norm_weight has shape (16,), expected (32,)", x, w, r, t.zeros(16, dtype=h))
        self.check_fails("norm_weight has dtype torch.float32, expected torch.float16", x, w, r, g.float())
        self.check_fails("residual and norm_weight come together (the fused residual + RMSNorm form)", x, w, r, None)

    def test_reducescatter_messages_name_the_problem(self):
        t = self.torch
        h = t.float16
        spec = self.RsSpec(t)  # world 2, rank 1, standard
        x, w, g = t.zeros(8, 16, dtype=h), t.zeros(32, 16, dtype=h), t.zeros(32, dtype=h)
        self.fot.check_rs_inputs(spec, x, w)
        self.fot.check_rs_inputs(spec, x, w, t.zeros(4, 32, dtype=h), g)  # (residual: this rank's m / 2 rows)
        self.fot.check_rs_inputs(spec, t.zeros(64, 16, dtype=h), w)
        self.fot.check_rs_inputs(spec, t.zeros(0, 16, dtype=h), w)
        self.rs_check_fails(spec, "x has m = 7 rows, not a multiple of the world size 2 (the standard layout gives "
                                  "every rank m / world rows: pad x, or use layout='subtile')", t.zeros(7, 16, dtype=h), w)
        self.rs_check_fails(spec, "residual has shape (8, 32), expected (4, 32)", x, w, t.zeros(8, 32, dtype=h), g)
        self.rs_check_fails(spec, "x must be a torch.Tensor, not list", [1.0], w)
        self.rs_check_fails(spec, "x has dtype torch.float32, expected torch.float16", x.float(), w)
        self.rs_check_fails(spec, "weight has dtype torch.bfloat16, expected torch.float16", x, w.bfloat16())
        self.rs_check_fails(spec, "x is on meta, expected cpu", t.zeros(8, 16, dtype=h, device="meta"), w)
        self.rs_check_fails(spec, "x has 1 dimensions (shape (16,), strides (1,)), expected 2", t.zeros(16, dtype=h), w)
        self.rs_check_fails(spec, "x has shape (8, 8), expected (m, 16)", t.zeros(8, 8, dtype=h), w)
        self.rs_check_fails(spec, "weight has shape (16, 16), expected (32, 16)", x, t.zeros(16, 16, dtype=h))
        self.rs_check_fails(spec, "x is not contiguous (shape (8, 16), strides (1, 8)): the op reads row-major rows; "
                                  "pass x.contiguous()", t.zeros(16, 8, dtype=h).t(), w)
        self.rs_check_fails(spec, "x has m = 66 rows, more than the op's max_m = 64 (build the op with a larger max_m)",
                            t.zeros(66, 16, dtype=h), w)
        self.rs_check_fails(spec, "norm_weight has shape (16,), expected (32,)", x, w, t.zeros(4, 32, dtype=h),
                            t.zeros(16, dtype=h))
        self.rs_check_fails(spec, "residual and norm_weight come together (the fused residual + RMSNorm form)", x, w,
                            t.zeros(4, 32, dtype=h), None)
        self.rs_check_fails(spec, "residual is not contiguous (shape (4, 32), strides (1, 4)): the op reads row-major "
                                  "rows; pass residual.contiguous()", x, w, t.zeros(32, 4, dtype=h).t(), g)
        # the sub-tile layout: any m; the residual is this rank's rows of the tile rows
        sub = self.RsSpec(t, world=2, rank=1, layout="subtile")
        sub.max_m = 256
        x7 = t.zeros(7, 16, dtype=h)
        self.fot.check_rs_inputs(sub, x7, w, t.zeros(0, 32, dtype=h), g)  # (rank 1's half of the one tile row: none)
        self.fot.check_rs_inputs(sub, t.zeros(200, 16, dtype=h), w, t.zeros(72, 32, dtype=h), g)
        self.rs_check_fails(sub, "residual has shape (100, 32), expected (72, 32)", t.zeros(200, 16, dtype=h), w,
                            t.zeros(100, 32, dtype=h), g)

    def test_reducescatter_call_checks_before_any_work(self):
        t = self.torch
        saved = self.fot._torch
        self.fot._torch = t
        self.addCleanup(setattr, self.fot, "_torch", saved)

        def make(layout, world=2):
            op = object.__new__(self.fot.GemmReduceScatter)
            op.max_m, op.n, op.k, op.dtype, op.device = 64, 32, 16, t.float16, t.device("cpu")
            op.world, op.rank, op.layout = world, 0, layout
            return op

        op, sub = make("standard"), make("subtile")
        w = t.zeros(32, 16, dtype=t.float16)
        name = "GemmReduceScatter(max_m=64, n=32, k=16, float16, cpu, world 2, standard layout)"
        self.assertEqual(str(op), name)
        with self.assertRaisesRegex(InvalidArgument, "^" + re.escape(name) + ": x must be a torch.Tensor, not list"):
            op([1.0], w)
        with self.assertRaisesRegex(InvalidArgument, "residual and norm_weight come together"):
            op(t.zeros(8, 16, dtype=t.float16), w, residual=t.zeros(4, 32, dtype=t.float16))
        with self.assertRaisesRegex(InvalidArgument, re.escape("x has shape (3, 4, 16): its first dimension 3 is not a "
                                                               "multiple of the world size 2")):
            op(t.zeros(3, 4, 16, dtype=t.float16), w)
        with self.assertRaisesRegex(InvalidArgument, r"x is not contiguous \(shape \(2, 4, 8\)"):
            op(t.zeros(2, 4, 16, dtype=t.float16)[:, :, :8], w)
        with self.assertRaisesRegex(InvalidArgument, "x has 3 dimensions .*: the sub-tile layout takes x as \\(m, k\\)"):
            sub(t.zeros(2, 4, 16, dtype=t.float16), w)
        for m, message in ((0, "m = 0: needs 1 <= m <= max_m = 64"), (65, "m = 65: needs 1 <= m <= max_m = 64"),
                           (True, "m = True: needs"), (7, "m = 7 is not a multiple of the world size 2 (the standard "
                                                         "layout gives every rank m / world rows)")):
            for method in (op.prepare, op.plan, op.rows_out, op.rows):
                with self.assertRaisesRegex(InvalidArgument, "^" + re.escape(f"{name}: {message}")):
                    method(m)
        self.assertEqual(sub._m(7), 7)  # (any m in the sub-tile layout)

    def gather_fails(self, spec, message, y, m, bound_m=True):
        with self.assertRaises(InvalidArgument) as cm:
            self.fot.check_gather_inputs(spec, y, m, bound_m)
        self.assertEqual(str(cm.exception), f"{spec}: " + message)
        self.assertIsInstance(cm.exception, ValueError)

    def test_all_gather_rows_messages_name_the_problem(self):
        t = self.torch
        h = t.float16
        spec = self.RsSpec(t)  # world 2, rank 1, standard: rows_out(m) = m / 2
        check = self.fot.check_gather_inputs
        check(spec, t.zeros(4, 32, dtype=h), 8)
        check(spec, t.zeros(32, 32, dtype=h), 64)
        check(spec, t.zeros(0, 32, dtype=h), 0)  # (an empty batch: nothing gathered)
        check(spec, t.zeros(33, 32, dtype=h), 66, bound_m=False)  # (the fake implementation's: no max_m)
        shape = "this rank's rows_out(m) = 4 rows of the sum for m = 8, as the op's output gives them"
        self.gather_fails(spec, f"all_gather_rows: y has shape (5, 32), expected (4, 32): {shape}",
                          t.zeros(5, 32, dtype=h), 8)
        self.gather_fails(spec, f"all_gather_rows: y has shape (4, 16), expected (4, 32): {shape}",
                          t.zeros(4, 16, dtype=h), 8)
        self.gather_fails(spec, "all_gather_rows: m = 7 is not a multiple of the world size 2 (the standard layout "
                                "gives every rank m / world rows)", t.zeros(3, 32, dtype=h), 7)
        self.gather_fails(spec, "all_gather_rows: m = 66: needs 0 <= m <= max_m = 64", t.zeros(33, 32, dtype=h), 66)
        self.gather_fails(spec, "all_gather_rows: m = -2: needs 0 <= m <= max_m = 64", t.zeros(0, 32, dtype=h), -2)
        self.gather_fails(spec, "y must be a torch.Tensor, not list", [1.0], 8)
        self.gather_fails(spec, "y has dtype torch.float32, expected torch.float16", t.zeros(4, 32), 8)
        self.gather_fails(spec, "y has dtype torch.bfloat16, expected torch.float16", t.zeros(4, 32, dtype=t.bfloat16), 8)
        self.gather_fails(spec, "y is on meta, expected cpu", t.zeros(4, 32, dtype=h, device="meta"), 8)
        self.gather_fails(spec, "y has 1 dimensions (shape (32,), strides (1,)), expected 2", t.zeros(32, dtype=h), 8)
        self.gather_fails(spec, "y has 3 dimensions (shape (2, 2, 32), strides (64, 32, 1)), expected 2",
                          t.zeros(2, 2, 32, dtype=h), 8)
        self.gather_fails(spec, "y is not contiguous (shape (4, 32), strides (1, 4)): the op reads row-major rows; "
                                "pass y.contiguous()", t.zeros(32, 4, dtype=h).t(), 8)
        # the sub-tile layout: any m; y this rank's rows of the tile rows (rank 1 of 2: 64 of each 128)
        sub = self.RsSpec(t, world=2, rank=1, layout="subtile")
        sub.max_m = 256
        check(sub, t.zeros(72, 32, dtype=h), 200)
        check(sub, t.zeros(0, 32, dtype=h), 7)  # (rank 1's half of the one tile row: none)
        check(sub, t.zeros(64, 32, dtype=h), 128)
        self.gather_fails(sub, "all_gather_rows: y has shape (7, 32), expected (0, 32): this rank's rows_out(m) = 0 "
                               "rows of the sum for m = 7, as the op's output gives them", t.zeros(7, 32, dtype=h), 7)
        self.gather_fails(sub, "all_gather_rows: y has shape (100, 32), expected (72, 32): this rank's rows_out(m) = "
                               "72 rows of the sum for m = 200, as the op's output gives them",
                          t.zeros(100, 32, dtype=h), 200)
        self.gather_fails(sub, "all_gather_rows: m = 257: needs 0 <= m <= max_m = 256", t.zeros(1, 32, dtype=h), 257)
        odd = self.RsSpec(t, world=2, rank=0, layout="subtile")
        odd.n = 30
        self.gather_fails(odd, "all_gather_rows: the sub-tile layout's row exchange needs n % 8 == 0, not n = 30",
                          t.zeros(4, 30, dtype=h), 4)
        odd.layout = "standard"  # (the standard layout's one ncclAllGather takes any n)
        check(odd, t.zeros(2, 30, dtype=h), 4)

    def test_all_gather_rows_checks_before_any_work(self):
        t = self.torch
        fot = self.fot
        saved = fot._torch
        self.addCleanup(setattr, fot, "_torch", saved)
        calls = []
        # A stand-in torch whose custom op records what the method gives it (no torch.library here).
        fot._torch = types.SimpleNamespace(is_tensor=t.is_tensor, ops=types.SimpleNamespace(
            flashoverlap=types.SimpleNamespace(
                gemm_reduce_scatter_all_gather_rows=lambda y, m, handle: calls.append((tuple(y.shape), m, handle)))))

        def make(layout, world=2):
            op = object.__new__(fot.GemmReduceScatter)
            op.max_m, op.n, op.k, op.dtype, op.device = 64, 32, 16, t.float16, t.device("cpu")
            op.world, op.rank, op.layout, op.handle = world, 0, layout, 4321
            return op

        op, sub = make("standard"), make("subtile")
        y = t.zeros(4, 32, dtype=t.float16)
        name = "GemmReduceScatter(max_m=64, n=32, k=16, float16, cpu, world 2, subtile layout)"
        with self.assertRaisesRegex(InvalidArgument, "^" + re.escape(name) + r": all_gather_rows: m is required with "
                                    r"the sub-tile layout \(this rank's rows do not say m\): pass "
                                    r"all_gather_rows\(y, m\), m the rows of x$"):
            sub.all_gather_rows(y)
        for bad in (True, 8.0, "8"):
            with self.assertRaisesRegex(InvalidArgument, re.escape(f"all_gather_rows: m = {bad!r} is not an int")):
                op.all_gather_rows(y, bad)
        with self.assertRaisesRegex(InvalidArgument, "all_gather_rows: y must be a torch.Tensor, not list"):
            op.all_gather_rows([1.0])
        self.assertEqual(calls, [])
        # what reaches the custom op: the standard layout's default m, y.shape[0] * world; m as given
        op.all_gather_rows(y)
        op.all_gather_rows(y, 8)
        sub.all_gather_rows(t.zeros(0, 32, dtype=t.float16), 7)
        op.all_gather_rows(t.zeros(0, 32, dtype=t.float16))
        make("standard", world=4).all_gather_rows(y)
        self.assertEqual(calls, [((4, 32), 8, 4321), ((4, 32), 8, 4321), ((0, 32), 7, 4321), ((0, 32), 0, 4321),
                                 ((4, 32), 16, 4321)])
        # the custom op's real implementation validates before it allocates or enqueues anything
        fot._torch = t
        with self.assertRaisesRegex(InvalidArgument, re.escape("all_gather_rows: y has shape (4, 32), expected (2, 32)")):
            op._all_gather_rows(y, 4)
        with self.assertRaisesRegex(InvalidArgument, "y has dtype torch.float32, expected torch.float16"):
            op._all_gather_rows(t.zeros(4, 32), 8)
        with self.assertRaisesRegex(InvalidArgument, re.escape("all_gather_rows: m = 66: needs 0 <= m <= max_m = 64")):
            op._all_gather_rows(t.zeros(33, 32, dtype=t.float16), 66)

    # ---- GemmAllToAll ----

    def a2a_args(self, rows=5, **kw):
        """A call's arguments (world 2): x (rows, 16), w (32, 16), routing tensors, counts, tokens 7, combine."""
        t = self.torch
        args = dict(x=t.zeros(rows, 16, dtype=t.float16), weight=t.zeros(32, 16, dtype=t.float16),
                    dest_rank=t.tensor([i % 2 for i in range(rows)], dtype=t.int64),
                    dest_token=t.arange(rows, dtype=t.int32), gate=t.ones(rows), send_counts=[(rows + 1) // 2, rows // 2],
                    recv_counts=[4, 0], tokens=7, combine=True)
        args.update(kw)
        return args

    def a2a_fails(self, message, spec=None, **kw):
        spec = spec or self.A2aSpec(self.torch)
        with self.assertRaises(InvalidArgument) as cm:
            self.fot.check_a2a_inputs(spec, **self.a2a_args(**kw))
        self.assertEqual(str(cm.exception), f"{spec}: " + message)
        self.assertIsInstance(cm.exception, ValueError)

    def test_alltoall_messages_name_the_problem(self):
        t = self.torch
        h = t.float16
        spec = self.A2aSpec(t)
        check = lambda **kw: self.fot.check_a2a_inputs(spec, **self.a2a_args(**kw))  # noqa: E731
        check()
        check(rows=0)  # (an expert without rows)
        check(gate=None, combine=False)  # (the rows, unweighted: no gates needed)
        check(gate=t.ones(5, dtype=t.bfloat16), dest_rank=t.zeros(5, dtype=t.int32), dest_token=t.zeros(5, dtype=t.int16))
        check(dest_rank=t.zeros(5, dtype=t.int64, device="meta"), gate=t.ones(5, device="meta"))  # (any device)
        check(send_counts=(3, 2), tokens=0)
        self.a2a_fails("x has dtype torch.float32, expected torch.float16", x=t.zeros(5, 16))
        self.a2a_fails("x has shape (5, 8), expected (m, 16)", x=t.zeros(5, 8, dtype=h))
        self.a2a_fails("x is not contiguous (shape (5, 16), strides (1, 5)): the op reads row-major rows; pass "
                       "x.contiguous()", x=t.zeros(16, 5, dtype=h).t())
        self.a2a_fails("weight has shape (16, 16), expected (32, 16)", weight=t.zeros(16, 16, dtype=h))
        self.a2a_fails("dest_rank must be a torch.Tensor, not list", dest_rank=[0, 1, 0, 1, 0])
        self.a2a_fails("dest_rank has dtype torch.float32, expected an integer dtype (int32 or int64)",
                       dest_rank=t.zeros(5))
        self.a2a_fails("dest_rank has dtype torch.bool, expected an integer dtype (int32 or int64)",
                       dest_rank=t.zeros(5, dtype=t.bool))
        self.a2a_fails("dest_rank has shape (5, 1), expected (5,): one entry per row of x",
                       dest_rank=t.zeros(5, 1, dtype=t.int64))
        self.a2a_fails("dest_token has shape (4,), expected (5,): one entry per row of x",
                       dest_token=t.zeros(4, dtype=t.int64))
        self.a2a_fails("gate_weight is required to combine (combine=False returns the rows unweighted)", gate=None)
        self.a2a_fails("gate_weight must be a torch.Tensor, not list", gate=[1.0] * 5)
        self.a2a_fails("gate_weight has dtype torch.int64, expected a floating dtype (float32)",
                       gate=t.ones(5, dtype=t.int64))
        self.a2a_fails("gate_weight has shape (6,), expected (5,): one entry per row of x", gate=t.ones(6))
        self.a2a_fails("gate_weight has shape (6,), expected (5,): one entry per row of x", gate=t.ones(6),
                       combine=False)
        self.a2a_fails("send_counts must be a list of the world size 2 ints", send_counts=[5])
        self.a2a_fails("recv_counts must be a list of the world size 2 ints", recv_counts=t.tensor([4, 0]))
        for bad in (7.0, True, "7", None):
            self.a2a_fails(f"tokens = {bad!r} is not an int (this rank's tokens)", tokens=bad)

    def test_alltoall_weight_with_several_experts(self):
        # (experts > 1: the experts' weights stacked, (experts, n, k); one expert: (n, k) or (1, n, k))
        t = self.torch
        h = t.float16
        three = self.A2aSpec(t, experts=3)
        counts = [1, 0, 2, 0, 2, 0]  # (rank 0's rows: 1 for expert 0, 2 for expert 2; rank 1's: 2 for expert 1)
        w3 = t.zeros(3, 32, 16, dtype=h)
        self.fot.check_a2a_inputs(three, **self.a2a_args(weight=w3), expert_counts=counts)
        self.fot.check_a2a_inputs(three, **self.a2a_args(rows=0, weight=w3, send_counts=[0, 0]),
                                  expert_counts=[0] * 6)
        self.fot.check_a2a_inputs(self.A2aSpec(t), **self.a2a_args(weight=t.zeros(1, 32, 16, dtype=h)))
        fails = lambda spec, message, counts=None, **kw: self.a2a_fails(  # noqa: E731
            message, spec, expert_counts=counts, **kw)
        fails(three, "weight has shape (32, 16), expected (3, 32, 16): the 3 experts' weights stacked (experts, n, k)",
              counts, weight=t.zeros(32, 16, dtype=h))
        fails(three, "weight has shape (2, 32, 16), expected (3, 32, 16)", counts, weight=t.zeros(2, 32, 16, dtype=h))
        fails(three, "weight has shape (3, 16, 16), expected (3, 32, 16)", counts, weight=t.zeros(3, 16, 16, dtype=h))
        fails(three, "weight has dtype torch.float32, expected torch.float16", counts, weight=t.zeros(3, 32, 16))
        fails(three, "weight is not contiguous (shape (3, 32, 16), strides (16, 48, 1)): the op reads row-major rows; "
              "pass weight.contiguous()", counts, weight=t.zeros(32, 3, 16, dtype=h).transpose(0, 1))
        one = self.A2aSpec(t)
        fails(one, "weight has shape (2, 32, 16), expected (1, 32, 16)", weight=t.zeros(2, 32, 16, dtype=h))
        fails(one, "weight has shape (2, 2, 32, 16), expected (32, 16) (or (1, 32, 16))",
              weight=t.zeros(2, 2, 32, 16, dtype=h))
        fails(one, "weight has shape (512,), expected (32, 16) (or (1, 32, 16))", weight=t.zeros(512, dtype=h))

    def test_alltoall_expert_counts(self):
        t = self.torch
        three = self.A2aSpec(t, experts=3)
        w3 = t.zeros(3, 32, 16, dtype=t.float16)
        fails = lambda message, counts, spec=three, **kw: self.a2a_fails(  # noqa: E731
            message, spec, expert_counts=counts, **kw)
        fails("expert_counts is required with 3 experts per rank: the rows of x from each rank for each expert, 6 ints "
              "(world x experts, source-major)", None, weight=w3)
        fails("expert_counts has 5 entries, expected world x experts = 2 x 3 = 6 ints", [1, 0, 2, 0, 2], weight=w3)
        fails("expert_counts has 7 entries, expected world x experts = 2 x 3 = 6 ints", [1, 0, 2, 0, 2, 0, 0],
              weight=w3)
        fails("expert_counts must be a list of world x experts = 2 x 3 = 6 ints, not int", 5, weight=w3)
        fails("expert_counts = [1, 0, 2.0, 0, 2, 0]: not a list of ints", [1, 0, 2.0, 0, 2, 0], weight=w3)
        # The values against each other: at world 1 here; at world 2 the library's, on every rank at once.
        for bad in ([2, -1, 2, 0, 2, 0], [1, 0, 1, 0, 2, 0], [1, 0, 2, 0, 3, 0]):
            self.fot.check_expert_counts(three, bad, [3, 2])
        alone = self.A2aSpec(t, world=1, experts=3)
        one_rank = lambda message, counts: self.a2a_fails(  # noqa: E731
            message, alone, expert_counts=counts, weight=w3, dest_rank=t.zeros(5, dtype=t.int64), send_counts=[5],
            recv_counts=[5])
        one_rank("expert_counts[1] = -1 (rank 0, expert 1) is negative", [2, -1, 4])
        one_rank("expert_counts of rank 0 ([1, 0, 1]) sum to 2, but send_counts[0] = 5: rank 0's rows, expert after "
                 "expert, are the rows that go back to it", [1, 0, 1])
        fails("expert_counts is for several experts per rank; this op has one (pass None: send_counts say the rows)",
              [3, 2], spec=self.A2aSpec(t))
        # (a fake call's SymInts are not compared: no guard on them; plain ints only here)
        self.fot.check_expert_counts(three, [1, 0, 2, 0, 2, 0], [3, 2])
        self.fot.check_expert_counts(self.A2aSpec(t), None, [3, 2])
        # the forms a call takes, as one flat source-major list
        counts = lambda v, spec=three: self.fot._expert_counts(t, spec, v)  # noqa: E731
        flat = [1, 0, 2, 0, 2, 0]
        self.assertIsNone(counts(None))
        for form in (flat, tuple(flat), [[1, 0, 2], [0, 2, 0]], ([1, 0, 2], (0, 2, 0)), t.tensor(flat),
                     t.tensor(flat, dtype=t.int32).view(2, 3), t.tensor(flat, dtype=t.int16)):
            self.assertEqual(counts(form), flat, repr(form))
        for bad, message in (
                ([[1, 0, 2], [0, 2]], "expert_counts has 2 lists of [3, 2] entries, expected the world size 2 lists "
                                      "of 3 (one per expert of this rank)"),
                ([[1, 0, 2]], "expert_counts has 1 lists of [3] entries, expected the world size 2 lists of 3"),
                ([[1, 0, 2], 0, 2, 0], "expert_counts = [[1, 0, 2], 0, 2, 0]: not a list of ints"),
                (t.tensor([1.0] * 6), "expert_counts must be an integer tensor of shape (6,) or (2, 3) (world x "
                                      "experts), or a list of ints, not a tensor of dtype torch.float32 and shape "
                                      "(6,), strides (1,)"),
                (t.zeros(3, 2, dtype=t.int64), "expert_counts must be an integer tensor of shape (6,) or (2, 3)"),
                (t.zeros(5, dtype=t.int64), "expert_counts must be an integer tensor of shape (6,) or (2, 3)"),
                ("123456", "expert_counts must be a list of 6 ints (world 2 x 3 experts, source-major), 2 lists of 3, "
                           "or an integer tensor, not str")):
            with self.assertRaises(InvalidArgument) as cm:
                counts(bad)
            self.assertTrue(str(cm.exception).startswith(f"{three}: {message}"), str(cm.exception))

    def test_alltoall_counts(self):
        t = self.torch
        spec = self.A2aSpec(t)
        counts = lambda v: self.fot._counts(t, spec, "send_counts", v)  # noqa: E731
        self.assertEqual(counts([3, 2]), [3, 2])
        self.assertEqual(counts((0, 7)), [0, 7])
        self.assertEqual(counts(t.tensor([4, 1])), [4, 1])
        self.assertEqual(counts(t.tensor([4, 1], dtype=t.int32)), [4, 1])
        self.assertEqual(counts([-1, 2]), [-1, 2])  # (a value the library refuses, on every rank)
        for bad, message in (([1], "send_counts has 1 entries, expected the world size 2 (one per rank)"),
                             ([1, 2, 3], "send_counts has 3 entries, expected the world size 2 (one per rank)"),
                             ([1, 2.0], "send_counts = [1, 2.0]: not a list of ints"),
                             ([True, 1], "send_counts = [True, 1]: not a list of ints"),
                             (5, "send_counts must be a list of 2 ints (one per rank) or a 1-D integer tensor, not int"),
                             (t.tensor([1.0, 2.0]), "send_counts must be a 1-D integer tensor or a list of ints, not a "
                                                    "tensor of dtype torch.float32 and shape (2,), strides (1,)"),
                             (t.tensor([[1, 2]]), "send_counts must be a 1-D integer tensor or a list of ints, not a "
                                                  "tensor of dtype torch.int64 and shape (1, 2), strides (2, 1)")):
            with self.assertRaises(InvalidArgument) as cm:
                counts(bad)
            self.assertEqual(str(cm.exception), f"{spec}: {message}")

    def test_alltoall_host_copies(self):
        t = self.torch
        spec = self.A2aSpec(t)
        h = self.fot._host_int32(spec, "dest_token", t.tensor([3, 0, 2 ** 31 - 1, -2 ** 31], dtype=t.int64))
        self.assertEqual((h.dtype, h.tolist()), (t.int32, [3, 0, 2 ** 31 - 1, -2 ** 31]))
        h = self.fot._host_int32(spec, "dest_rank", t.arange(10, dtype=t.int32)[::2])  # (a strided view: copied)
        self.assertTrue(h.is_contiguous())
        self.assertEqual(h.tolist(), [0, 2, 4, 6, 8])
        self.assertEqual(self.fot._host_int32(spec, "dest_rank", t.zeros(0, dtype=t.int64)).numel(), 0)
        for v in (2 ** 31, -2 ** 31 - 1):
            with self.assertRaisesRegex(InvalidArgument, "^" + re.escape(f"{spec}: dest_token has values outside "
                                                                        "int32 (from")):
                self.fot._host_int32(spec, "dest_token", t.tensor([1, v], dtype=t.int64))

    def make_a2a_op(self, world=2, experts=1):
        t = self.torch
        op = object.__new__(self.fot.GemmAllToAll)
        op.max_rows, op.max_tokens, op.topk, op.n, op.k, op.experts = 64, 32, 2, 32, 16, experts
        op.dtype, op.device, op.world, op.rank, op.handle = t.float16, t.device("cpu"), world, 0, 4322
        op._routing = self.fot._capi.RoutingSlot(world, experts)  # (as __init__ makes it)
        return op

    def test_alltoall_call_checks_before_any_work(self):
        t = self.torch
        fot = self.fot
        saved = fot._torch
        self.addCleanup(setattr, fot, "_torch", saved)
        calls = []
        record = lambda name: lambda *args: calls.append((name,) + args)  # noqa: E731
        # A stand-in torch whose custom ops record what the call gives them (no torch.library here),
        # compiling: the call goes through the custom ops, as traced code's does (eager calls skip them).
        fot._torch = types.SimpleNamespace(is_tensor=t.is_tensor, bool=t.bool,
                                           compiler=types.SimpleNamespace(is_compiling=lambda: True),
                                           ops=types.SimpleNamespace(
            flashoverlap=types.SimpleNamespace(gemm_all_to_all=record("combine"), gemm_all_to_all_rows=record("rows"))))
        op = self.make_a2a_op()
        name = "GemmAllToAll(max_rows=64, max_tokens=32, topk=2, n=32, k=16, float16, cpu, world 2)"
        self.assertEqual(str(op), name)
        a = self.a2a_args()
        x, w, dr, dt, g = a["x"], a["weight"], a["dest_rank"], a["dest_token"], a["gate"]
        for call, message in (
                (lambda: op([1.0], w, dr, dt, g, [3, 2], [4, 0], 7), "x must be a torch.Tensor, not list"),
                (lambda: op(x, w, dr, dt, None, [3, 2], [4, 0], 7), "gate_weight is required to combine"),
                (lambda: op(x, w, dr, dt, g, [3, 2], [4, 0], 7.5), "tokens = 7.5 is not an int"),
                (lambda: op(x, w, dr, dt, g, [3], [4, 0], 7), "send_counts has 1 entries, expected the world size 2"),
                (lambda: op(x, w, dr, dt, g, [3, 2], None, 7), "recv_counts must be a list of 2 ints")):
            with self.assertRaises(InvalidArgument) as cm:
                call()
            self.assertTrue(str(cm.exception).startswith(f"{name}: {message}"), str(cm.exception))
        self.assertEqual(calls, [])
        # what reaches the custom ops: the counts as lists (from tensors too), tokens, the handle
        op(x, w, dr, dt, g, t.tensor([3, 2]), (4, 0), 7)
        op(x, w, dr, dt, None, [3, 2], [4, 0], 7, combine=False)
        op(x, w, dr, dt, g, [3, 2], [4, 0], 7, False)
        self.assertEqual([(c[0],) + tuple(c[6:]) for c in calls],
                         [("combine", [3, 2], [4, 0], 7, 4322), ("rows", [3, 2], [4, 0], 7, 4322),
                          ("rows", [3, 2], [4, 0], 7, 4322)])
        self.assertEqual([c[5] is g for c in calls], [True, False, True])
        self.assertIsNone(calls[1][5])
        # one expert: expert_counts refused (send_counts say the rows)
        with self.assertRaisesRegex(InvalidArgument, "^" + re.escape(f"{name}: expert_counts is for several experts "
                                                                     "per rank; this op has one")):
            op(x, w, dr, dt, g, [3, 2], [4, 0], 7, expert_counts=[3, 2])
        # several experts: expert_counts required and checked here, then handed on after the handle, a flat
        # source-major list of ints whatever form it came in
        del calls[:]
        op = self.make_a2a_op(experts=3)
        name = "GemmAllToAll(max_rows=64, max_tokens=32, topk=2, experts=3, n=32, k=16, float16, cpu, world 2)"
        self.assertEqual(str(op), name)
        w3 = t.zeros(3, 32, 16, dtype=t.float16)
        for call, message in (
                (lambda: op(x, w3, dr, dt, g, [3, 2], [4, 0], 7), "expert_counts is required with 3 experts per rank"),
                (lambda: op(x, w3, dr, dt, g, [3, 2], [4, 0], 7, expert_counts=[1, 2, 0, 2]),
                 "expert_counts has 4 entries, expected world x experts = 2 x 3 = 6 ints"),
                (lambda: op(x, w3, dr, dt, g, [3, 2], [4, 0], 7, expert_counts=t.ones(2, 2, dtype=t.int64)),
                 "expert_counts must be an integer tensor of shape (6,) or (2, 3)")):
            with self.assertRaises(InvalidArgument) as cm:
                call()
            self.assertTrue(str(cm.exception).startswith(f"{name}: {message}"), str(cm.exception))
        self.assertEqual(calls, [])
        op(x, w3, dr, dt, g, [3, 2], [4, 0], 7, expert_counts=[1, 0, 2, 0, 2, 0])
        op(x, w3, dr, dt, None, [3, 2], [4, 0], 7, combine=False, expert_counts=[[1, 0, 2], [0, 2, 0]])
        op(x, w3, dr, dt, g, t.tensor([3, 2]), [4, 0], 7, expert_counts=t.tensor([[1, 0, 2], [0, 2, 0]]))
        self.assertEqual([(c[0],) + tuple(c[6:]) for c in calls],
                         [(kind, [3, 2], [4, 0], 7, 4322, [1, 0, 2, 0, 2, 0])
                          for kind in ("combine", "rows", "combine")])
        self.assertTrue(all(c[2] is w3 for c in calls))

    def test_fast_way_takes_the_output_allocated_ahead(self):
        # An eager call in the steady state (an m called before, plain
        # contiguous tensors of the op's dtype on its device, no capture, no
        # autograd, not traced) is enqueued by the op's __call__ itself
        # (_fast_call) and returns the output
        # the call before allocated after itself (same rows, stream and
        # pool), allocating the next one; other rows, streams or pools get a
        # fresh tensor; anything else is left to the general way (_call),
        # nothing called or allocated there. (CPU tensors, device index -1; torch's
        # CUDA calls stood in for.)
        t, fot = self.torch, self.fot
        state = dict(stream=0x10, capturing=False, device=-1, pool=None, compiling=False)
        stand_ins = dict(_Tensor=t.Tensor, _Parameter=t.nn.Parameter, _is_compiling=lambda: state["compiling"],
                         _grad_enabled=t.is_grad_enabled, _get_device=lambda: state["device"],
                         _capturing=lambda: state["capturing"], _current_stream=lambda index: state["stream"],
                         _pool_id=lambda: state["pool"])
        for name, value in stand_ins.items():
            self.addCleanup(setattr, fot, name, getattr(fot, name))
            setattr(fot, name, value)
        op = object.__new__(fot.GemmAllReduce)
        op.n, op.k, op.dtype, op._index, op._c_handle = 32, 16, t.float16, -1, 7
        op._weight_shape, op._steady, op._ahead, op._ahead_rows = (32, 16), {4: 4, 8: 8, 100: 100}, None, 64
        calls = []
        op._c_run = lambda handle, a, b, out, m, stream, ld: calls.append((handle, a, b, out, m, stream, ld))
        op._call = lambda *args: None  # (the general way: None here)
        x4, x8 = t.randn(4, 16).half(), t.randn(8, 16).half()
        w = t.nn.Parameter(t.randn(32, 16).half(), requires_grad=False)

        y1 = op(x4, w)
        self.assertEqual((tuple(y1.shape), y1.dtype), ((4, 32), t.float16))
        self.assertEqual(calls[-1], (7, x4.data_ptr(), w.data_ptr(), y1.data_ptr(), 4, 0x10, 0))
        self.assertEqual(op._ahead[:2], ((4, 32, t.float16, -1, 0x10), None))
        nxt = op._ahead[2]
        y2 = op(x4, w)
        self.assertIs(y2, nxt)  # the one allocated ahead
        self.assertEqual(calls[-1][3], y2.data_ptr())
        state["stream"] = 0x20  # another stream: a fresh output, and the next one's for that stream
        nxt = op._ahead[2]
        y3 = op(x4, w)
        self.assertIsNot(y3, nxt)
        self.assertEqual(op._ahead[0], (4, 32, t.float16, -1, 0x20))
        y4 = op(x8, w)  # other rows: fresh
        self.assertEqual((tuple(y4.shape), op._ahead[0][0]), ((8, 32), 8))
        state["pool"] = (1, 2)  # a memory pool made current (torch.cuda.use_mem_pool): fresh, and the next from it
        nxt = op._ahead[2]
        y5 = op(x8, w)
        self.assertIsNot(y5, nxt)
        self.assertEqual((op._ahead[0][0], op._ahead[0][4], op._ahead[1]), (8, 0x20, (1, 2)))
        nxt = op._ahead[2]
        self.assertIs(op(x8, w), nxt)
        state["pool"] = None
        self.assertEqual(len({y.data_ptr() for y in (y1, y2, y3, y4, y5)}), 5)

        # not the steady state: the general way's (None), nothing called, the output ahead kept (and with
        # a residual: the fused form's, always the general way)
        n_calls, ahead = len(calls), op._ahead
        for key, value in (("capturing", True), ("device", 0), ("compiling", True)):
            state[key], saved = value, state[key]
            self.assertIsNone(op(x8, w), key)
            state[key] = saved
        x8_grad = x8.clone().requires_grad_()
        not_fast = [(t.randn(5, 16).half(), w),  # m 5 not called before
                    (x8.float(), w), (x8, w.float()),  # another dtype
                    (x8.view(2, 4, 16), w), (t.randn(16, 8).half().t(), w),  # 3-D; not contiguous
                    (t.randn(8, 8).half(), w), (x8, t.randn(16, 16).half()),  # other k; other n
                    (x8, t.randn(16, 32).half().t()),  # weight not contiguous
                    (t.nn.Parameter(x8), w),  # x a Parameter: not a plain tensor
                    (x8_grad, w)]  # autograd would record
        for i, (x, weight) in enumerate(not_fast):
            self.assertIsNone(op(x, weight), i)
        self.assertIsNone(op(x8, w, t.zeros(8, 32).half(), t.ones(32).half()))
        with t.no_grad():  # (no autograd: the fast way)
            self.assertIsNotNone(op(x8_grad, w))
        self.assertEqual(len(calls), n_calls + 1)
        self.assertIsNot(op._ahead, ahead)  # (it took the one ahead and allocated the next)
        ahead = op._ahead
        # past the cap: the next output is held per thread, for any op's call with its shape, dtype, device,
        # stream and pool (the op's own small one is kept)
        self.addCleanup(setattr, fot._big, "_ahead", None)
        fot._big._ahead = None
        x100 = t.randn(100, 16).half()
        big = op(x100, w)
        self.assertEqual((tuple(big.shape), len(calls), calls[-1][3]), ((100, 32), n_calls + 2, big.data_ptr()))
        self.assertIs(op._ahead, ahead)
        self.assertEqual(fot._big._ahead[:2], ((100, 32, t.float16, -1, 0x20), None))
        twin = object.__new__(fot.GemmAllReduce)  # another op of the same shape: it takes that output
        twin.__dict__.update(op.__dict__)
        twin._ahead, nxt = None, fot._big._ahead[2]
        self.assertIs(twin(x100, w), nxt)
        for key, value in (("stream", 0x30), ("pool", (3, 4))):  # another stream or pool: a fresh one
            state[key], saved, nxt = value, state[key], fot._big._ahead[2]
            self.assertIsNot(op(x100, w), nxt, key)
            self.assertEqual(fot._big._ahead[0][4] if key == "stream" else fot._big._ahead[1], value)
            state[key] = saved
        wide = object.__new__(fot.GemmAllReduce)  # another n: a fresh one
        wide.__dict__.update(op.__dict__)
        wide.n, wide._weight_shape, nxt = 48, (48, 16), fot._big._ahead[2]
        self.assertIsNot(wide(x100, t.randn(48, 16).half()), nxt)
        self.assertEqual(fot._big._ahead[0][:2], (100, 48))
        fot.clear_cache()  # drops it
        self.assertIsNone(fot._big._ahead)

    def test_alltoall_run_hands_the_library_the_routing(self):
        t = self.torch
        fot = self.fot
        saved = fot._torch
        fot._torch = t
        self.addCleanup(setattr, fot, "_torch", saved)
        op = self.make_a2a_op()
        seen, experts = [], [1]

        class Library:  # (the ctypes GemmAllToAll's run, recording what the routing says while it runs)
            def run(self, a, b, routing, out, ld_out, combine, tokens_out, stream):
                r = routing
                seen.append(dict(a=a, b=b, out=out, ld_out=ld_out, combine=combine, tokens_out=tokens_out,
                                 stream=stream, rows=r.rows, tokens=r.tokens, struct_size=r.struct_size,
                                 dest_rank=[r.dest_rank[i] for i in range(r.rows)],
                                 dest_token=[r.dest_token[i] for i in range(r.rows)],
                                 gate=[r.gate[i] for i in range(r.rows)] if r.gate else None,
                                 send=[r.send_counts[i] for i in range(2)], recv=[r.recv_counts[i] for i in range(2)],
                                 expert_counts=[r.expert_counts[i] for i in range(2 * experts[0])]
                                 if r.expert_counts else None))

        op._op = Library()
        op._on_device = lambda fn: fn()  # (no CUDA here: the call's device and stream are stand-ins)
        op._refuse_capture = lambda: None
        op._enqueue_call = lambda call: call(0x77)
        x, w = t.zeros(5, 16, dtype=t.float16), t.zeros(32, 16, dtype=t.float16)
        # (a weight of one expert, 3-D: the same memory, read alike)
        op._run(x, w[None], t.zeros(5, dtype=t.int64), t.zeros(5, dtype=t.int64), t.ones(5), [5, 0], [5, 0], 7,
                True)
        self.assertEqual((seen[-1]["b"], seen[-1]["expert_counts"]), (w.data_ptr(), None))
        dr = t.tensor([1, 0, 1, 0, 1], dtype=t.int64)
        dt = t.tensor([4, 0, 2, 6, 1], dtype=t.int64)
        g = t.tensor([0.5, 1.0, 0.25, 2.0, 1.5], dtype=t.bfloat16)
        out, tok = op._run(x, w, dr, dt, g, [2, 3], [1, 3], 7, True)
        self.assertEqual((tuple(out.shape), out.dtype, tok), ((7, 32), t.float16, None))
        s0 = seen[-1]
        self.assertEqual((s0["a"], s0["b"], s0["out"], s0["ld_out"], s0["combine"], s0["tokens_out"], s0["stream"]),
                         (x.data_ptr(), w.data_ptr(), out.data_ptr(), 0, True, None, 0x77))
        self.assertEqual((s0["struct_size"], s0["rows"], s0["tokens"], s0["dest_rank"], s0["dest_token"], s0["gate"],
                          s0["send"], s0["recv"]),
                         (80, 5, 7, [1, 0, 1, 0, 1], [4, 0, 2, 6, 1], [0.5, 1.0, 0.25, 2.0, 1.5], [2, 3], [1, 3]))
        # not combining: the received rows (sum(recv_counts)) and their tokens; no gates: NULL
        rows, tok = op._run(x, w, dr, dt, None, [2, 3], [1, 3], 7, False)
        self.assertEqual((tuple(rows.shape), tuple(tok.shape), tok.dtype), ((4, 32), (4,), t.int32))
        s1 = seen[-1]
        self.assertEqual((s1["combine"], s1["gate"], s1["out"], s1["tokens_out"]),
                         (False, None, rows.data_ptr(), tok.data_ptr()))
        # no rows, nothing received: NULL a, out and tokens_out; the combine still has its tokens
        e = t.zeros(0, dtype=t.int64)
        out, _ = op._run(x[:0], w, e, e, t.zeros(0), [0, 0], [0, 0], 3, True)
        self.assertEqual((tuple(out.shape), seen[-1]["a"], seen[-1]["rows"]), ((3, 32), 0, 0))
        rows, tok = op._run(x[:0], w, e, e, None, [0, 0], [0, 0], 3, False)
        self.assertEqual((tuple(rows.shape), seen[-1]["out"], seen[-1]["tokens_out"]), ((0, 32), 0, None))
        # a negative size allocates nothing: the library refuses it (on every rank)
        out, _ = op._run(x[:0], w, e, e, t.zeros(0), [0, 0], [0, 0], -1, True)
        self.assertEqual((tuple(out.shape), seen[-1]["tokens"]), ((0, 32), -1))
        # refused before the library is called
        n = len(seen)
        with self.assertRaisesRegex(InvalidArgument, "dest_token has values outside int32"):
            op._run(x, w, dr, dt + 2 ** 31, g, [2, 3], [1, 3], 7, True)
        with self.assertRaisesRegex(InvalidArgument, "gate_weight is required to combine"):
            op._run(x, w, dr, dt, None, [2, 3], [1, 3], 7, True)
        with self.assertRaisesRegex(InvalidArgument, r"dest_rank has shape \(4,\), expected \(5,\)"):
            op._run(x, w, dr[:4], dt, g, [2, 3], [1, 3], 7, True)
        self.assertEqual(len(seen), n)
        # several experts: the 3-D weight and each call's expert_counts, in the routing (80 bytes) the library reads
        experts[0] = 2
        op2 = self.make_a2a_op(experts=2)
        op2._op, op2._on_device, op2._refuse_capture, op2._enqueue_call = (op._op, op._on_device, op._refuse_capture,
                                                                           op._enqueue_call)
        w2 = t.zeros(2, 32, 16, dtype=t.float16)
        for counts in ([0, 2, 3, 0], [1, 1, 0, 3]):
            out, _ = op2._run(x, w2, dr, dt, g, [2, 3], [1, 3], 7, True, counts)
            s2 = seen[-1]
            self.assertEqual((s2["b"], s2["struct_size"], s2["expert_counts"], s2["send"], s2["dest_rank"]),
                             (w2.data_ptr(), 80, counts, [2, 3], [1, 0, 1, 0, 1]))
        rows, tok = op2._run(x, w2, dr, dt, None, [2, 3], [1, 3], 7, False, [2, 0, 0, 3])
        self.assertEqual((tuple(rows.shape), seen[-1]["expert_counts"]), ((4, 32), [2, 0, 0, 3]))
        n = len(seen)
        for weight, counts, message in ((w, [0, 2, 3, 0], r"weight has shape \(32, 16\), expected \(2, 32, 16\)"),
                                        (w2, None, "expert_counts is required with 2 experts per rank"),
                                        (w2, [2, 0, 0], r"expert_counts has 3 entries")):
            with self.assertRaisesRegex(InvalidArgument, message):
                op2._run(x, weight, dr, dt, g, [2, 3], [1, 3], 7, True, counts)
        self.assertEqual(len(seen), n)

    def test_op_handles_name_their_kind(self):
        fot = self.fot
        with self.assertRaisesRegex(FlashOverlapError, r"no op with handle 987654 \(closed or garbage-collected: keep "
                                    "the GemmReduceScatter alive"):
            fot._op_of(987654, fot.GemmReduceScatter)
        other = object.__new__(fot.GemmAllReduce)
        fot._ops[987655] = other
        self.addCleanup(fot._ops.pop, 987655, None)
        with self.assertRaisesRegex(FlashOverlapError, "handle 987655 is a GemmAllReduce, not a GemmReduceScatter"):
            fot._op_of(987655, fot.GemmReduceScatter)
        with self.assertRaisesRegex(FlashOverlapError, "handle 987655 is a GemmAllReduce, not a GemmAllToAll"):
            fot._op_of(987655, fot.GemmAllToAll)
        self.assertIs(fot._op_of(987655, fot.GemmAllReduce), other)

    def test_device_must_match(self):
        t = self.torch
        spec = self.Spec(t, "cuda:1")
        with self.assertRaisesRegex(InvalidArgument, "x is on cpu, expected cuda:1"):
            self.fot.check_inputs(spec, t.zeros(8, 16, dtype=t.float16), t.zeros(32, 16, dtype=t.float16))

    def test_constructor_arguments(self):
        t = self.torch
        for args, message in (((0, 32, 16), "max_m = 0, n = 32, k = 16: needs max_m >= 1"),
                              ((8, 0, 16), "n = 0, k = 16: needs"),
                              ((8, 32, 12), "k = 12: needs max_m >= 1, n >= 1 and k a positive multiple of 8"),
                              ((8.0, 32, 16), "max_m = 8.0 is not an int")):
            with self.assertRaisesRegex(InvalidArgument, re.escape(message)):
                self.fot._check_shape(*args)
        self.assertEqual(self.fot._check_dtype(t, t.bfloat16), 0)
        self.assertEqual(self.fot._check_dtype(t, t.float16), 1)
        with self.assertRaisesRegex(InvalidArgument, r"dtype torch.float32 is not supported: torch.bfloat16 or torch.float16"):
            self.fot._check_dtype(t, t.float32)
        with self.assertRaisesRegex(InvalidArgument, "device cpu is not a CUDA device"):
            self.fot._resolve_device(t, "cpu")
        # (GemmReduceScatter's name in its messages)
        with self.assertRaisesRegex(InvalidArgument, r"^GemmReduceScatter: max_m = 0, n = 32, k = 16: needs"):
            self.fot._check_shape(0, 32, 16, "GemmReduceScatter")
        with self.assertRaisesRegex(InvalidArgument, r"^GemmReduceScatter: dtype torch.float32 is not supported"):
            self.fot._check_dtype(t, t.float32, "GemmReduceScatter")
        with self.assertRaisesRegex(InvalidArgument, "^GemmReduceScatter: device cpu is not a CUDA device"):
            self.fot._resolve_device(t, "cpu", "GemmReduceScatter")
        if self.new_torch:  # (the op's own checks, before any device or group: torch >= 2.4)
            for kw, message in (({"layout": "diagonal"}, "layout = 'diagonal': one of 'standard', 'subtile'"),
                                ({"path": "row_bands"}, "path = 'row_bands': one of 'auto', 'sequential', 'slots'"),
                                ({"dtype": t.float32}, "dtype torch.float32 is not supported"),
                                ({"k": 12}, "max_m = 128, n = 32, k = 12: needs")):
                args = dict(group=None, max_m=128, n=32, k=16, dtype=t.bfloat16)
                args.update(kw)
                with self.assertRaisesRegex(InvalidArgument, "^GemmReduceScatter: " + re.escape(message)):
                    self.fot.GemmReduceScatter(**args)
            for kw, message in (({"path": "owners"}, "path = 'owners': one of 'auto', 'sequential', 'slots'"),
                                ({"experts": 0}, "experts = 0: needs experts >= 1 (experts per rank)"),
                                ({"dtype": t.float32}, "dtype torch.float32 is not supported"),
                                ({"max_rows": 0}, "max_rows = 0, max_tokens = 128, n = 32, k = 16: needs"),
                                ({"max_tokens": 1 << 30}, "max_rows = 128, max_tokens = 1073741824, n = 32, k = 16: "
                                                          "needs max_rows >= 1, 1 <= max_tokens < 2^30"),
                                ({"k": 12}, "max_rows = 128, max_tokens = 128, n = 32, k = 12: needs"),
                                ({"topk": 1.0}, "topk = 1.0 is not an int")):
                args = dict(group=None, max_rows=128, max_tokens=128, topk=1, n=32, k=16, dtype=t.bfloat16)
                args.update(kw)
                with self.assertRaisesRegex(InvalidArgument, "^GemmAllToAll: " + re.escape(message)):
                    self.fot.GemmAllToAll(**args)

    def test_alltoall_constructor_experts_and_topk(self):
        # GemmAllToAll's own checks of experts (before any device or group) and of topk against world x experts
        # (after the group), with torch's acceptance and the group stood in for (no torch >= 2.4 or GPU needed)
        t, fot = self.torch, self.fot
        saved = fot.require_torch
        fot.require_torch = lambda: t
        self.addCleanup(setattr, fot, "require_torch", saved)

        class Reached(Exception):
            pass

        class Probe(fot.GemmAllToAll):
            def _resolve(self, torch, group, device, who):
                self.device, self.group, self.rank, self.world = torch.device("cpu"), group, 0, 2

            def _connect(self, torch, comm, who):
                raise Reached((self.topk, self.experts))

        args = dict(group=None, max_rows=128, max_tokens=128, n=32, k=16, dtype=t.bfloat16)
        for kw, message in (({"topk": 1, "experts": 0}, "experts = 0: needs experts >= 1 (experts per rank)"),
                            ({"topk": 1, "experts": -1}, "experts = -1: needs experts >= 1"),
                            ({"topk": 1, "experts": 2.0}, "experts = 2.0 is not an int (experts per rank)"),
                            ({"topk": 1, "experts": None}, "experts = None is not an int"),
                            ({"topk": 3}, "topk = 3: needs 1 <= topk <= the world size 2 (each token picks distinct "
                                          "experts)"),
                            ({"topk": 0, "experts": 4}, "topk = 0: needs 1 <= topk <= the world size 2 x 4 experts per "
                                                        "rank = 8"),
                            ({"topk": 9, "experts": 4}, "topk = 9: needs 1 <= topk <= the world size 2 x 4 experts")):
            with self.subTest(**kw), self.assertRaisesRegex(InvalidArgument, "^GemmAllToAll: " + re.escape(message)):
                Probe(**args, **kw)
        for kw in ({"topk": 2}, {"topk": 8, "experts": 4}, {"topk": 3, "experts": 2}):
            with self.assertRaises(Reached) as cm:
                Probe(**args, **kw)
            self.assertEqual(cm.exception.args[0], (kw["topk"], kw.get("experts", 1)))

    def test_round_max_m(self):
        self.assertEqual([self.fot.round_max_m(m) for m in (0, 1, 128, 129, 4096, 5000)], [128, 128, 128, 256, 4096, 8192])

    def test_torch_older_than_2_4_is_refused_when_an_op_is_built(self):
        if self.new_torch:
            self.skipTest(f"torch {self.torch.__version__} is >= 2.4")
        message = rf"^flashoverlap.torch needs PyTorch >= 2.4 \(torch.library.custom_op registers its ops\); this is torch {re.escape(self.torch.__version__)}$"
        t = self.torch
        with self.assertRaisesRegex(FlashOverlapError, message):
            self.fot.GemmAllReduce(None, 128, 32, 16, t.bfloat16)
        with self.assertRaisesRegex(FlashOverlapError, message):
            self.fot.gemm_all_reduce(t.zeros(8, 16), t.zeros(32, 16))
        with self.assertRaisesRegex(FlashOverlapError, message):
            self.fot.GemmReduceScatter(None, 128, 32, 16, t.bfloat16)
        with self.assertRaisesRegex(FlashOverlapError, message):
            self.fot.gemm_reduce_scatter(t.zeros(8, 16), t.zeros(32, 16))
        with self.assertRaisesRegex(FlashOverlapError, message):
            self.fot.GemmAllToAll(None, 128, 128, 1, 32, 16, t.bfloat16)
        a = self.a2a_args()
        with self.assertRaisesRegex(FlashOverlapError, message):
            self.fot.gemm_all_to_all(a["x"], a["weight"], a["dest_rank"], a["dest_token"], a["gate"], [3, 2], [4, 0],
                                     None, 7)

    def test_no_gpu(self):
        t = self.torch
        if t.cuda.is_available():
            self.skipTest("torch sees a GPU")
        with self.assertRaisesRegex(NoGpu, r"no usable GPU: torch.cuda.is_available\(\) is False"):
            self.fot._require_gpu(t, t.device("cuda"))
        with self.assertRaisesRegex(NoGpu, r"^flashoverlap.torch.GemmReduceScatter: no usable GPU: "
                                    r"torch.cuda.is_available\(\) is False"):
            self.fot._require_gpu(t, t.device("cuda"), "GemmReduceScatter")
        if self.new_torch:  # (the op itself: torch >= 2.4 without a GPU)
            with self.assertRaisesRegex(NoGpu, "no usable GPU"):
                self.fot.GemmAllReduce(None, 128, 32, 16, t.bfloat16)
            with self.assertRaisesRegex(NoGpu, "^flashoverlap.torch.GemmReduceScatter: no usable GPU"):
                self.fot.GemmReduceScatter(None, 128, 32, 16, t.bfloat16, layout="subtile")
            with self.assertRaisesRegex(NoGpu, "no usable GPU"):
                self.fot.gemm_reduce_scatter(t.zeros(8, 16, dtype=t.bfloat16), t.zeros(32, 16, dtype=t.bfloat16))
            with self.assertRaisesRegex(NoGpu, "^flashoverlap.torch.GemmAllToAll: no usable GPU"):
                self.fot.GemmAllToAll(None, 128, 128, 1, 32, 16, t.bfloat16)

    def test_group_needs_torch_distributed(self):
        t = self.torch
        if t.distributed.is_available() and t.distributed.is_initialized():
            self.skipTest("torch.distributed is initialised")
        with self.assertRaisesRegex(InvalidArgument, "torch.distributed is not initialised: call "
                                    "torch.distributed.init_process_group first"):
            self.fot._resolve_group(t, None)
        with self.assertRaisesRegex(InvalidArgument, "^GemmReduceScatter: torch.distributed is not initialised"):
            self.fot._resolve_group(t, None, "GemmReduceScatter")
        with self.assertRaisesRegex(InvalidArgument, "^GemmAllToAll: torch.distributed is not initialised"):
            self.fot._resolve_group(t, None, "GemmAllToAll")

    def test_call_checks_before_any_work(self):
        t = self.torch
        saved = self.fot._torch  # (set by an accepted torch: here, maybe an older one)
        self.fot._torch = t
        self.addCleanup(setattr, self.fot, "_torch", saved)
        op = object.__new__(self.fot.GemmAllReduce)
        op.max_m, op.n, op.k, op.dtype, op.device, op.world = 64, 32, 16, t.float16, t.device("cpu"), 1
        x, w = t.zeros(2, 4, 16, dtype=t.float16), t.zeros(32, 16, dtype=t.float16)
        with self.assertRaisesRegex(InvalidArgument, "residual and norm_weight come together"):
            op(x[0], w, residual=t.zeros(4, 32, dtype=t.float16))
        with self.assertRaisesRegex(InvalidArgument, r"x is not contiguous \(shape \(2, 4, 8\)"):
            op(x[:, :, :8], w)
        with self.assertRaisesRegex(InvalidArgument, "x must be a torch.Tensor, not list"):
            op([1.0], w)


if __name__ == "__main__":
    unittest.main()
