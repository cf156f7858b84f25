"""The three surfaces in step: every option and call of the C++ API
(include/flashoverlap/flashoverlap.h) exists in the C ABI
(flashoverlap_c.h: an options field of the same name, a function
fo_gemm_<op>_<call>) and in Python (flashoverlap.torch: a constructor
keyword of the same name, a method), under one name; where a surface says
it in its own idiom (C's shape() for the C++ accessors, Python's call for
run), the table below says so. Read from the headers' text and the
package's classes: no library, no torch, no GPU."""
import inspect
import os
import re
import sys
import unittest

ROOT = os.environ.get("FO_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import flashoverlap.torch as fot  # noqa: E402  (imports without torch: the classes are plain Python)

OPS = {"allreduce": "GemmAllReduce", "reducescatter": "GemmReduceScatter", "alltoall": "GemmAllToAll",
       "grouped": "GroupedGemm"}
COLLECTIVES = {op: name for op, name in OPS.items() if op != "grouped"}  # (the ops with an NVLink path)

# C++ calls a surface spells otherwise: {call: (C function suffix or None, Python name or None)}; None: the
# surface's idiom stands for it, named in the reason.
ACCESSORS = {"max_m", "n", "k", "dtype", "world", "max_rows", "max_tokens", "topk", "experts"}  # C: fo_gemm_<op>_shape; Python: attributes
PYTHON_NAMES = {"run": "__call__", "run_rmsnorm": "__call__", "run_offsets": "__call__"}  # (offs=)  # (op(x, w) and op(x, w, residual=, norm_weight=))


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def block(text, opener):
    """The text of the brace block that starts at `opener` (its first line)."""
    start = text.index(opener)
    depth, i = 0, text.index("{", start)
    for j in range(i, len(text)):
        depth += text[j] == "{"
        depth -= text[j] == "}"
        if depth == 0:
            return text[i + 1:j]
    raise AssertionError(f"unbalanced block after {opener!r}")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def cpp_options(header, cls):
    """Field names of struct <cls>Options (enums skipped)."""
    body = strip_comments(block(header, f"struct {cls}Options {{"))
    body = re.sub(r"enum class \w+ \{[^}]*\};", "", body)
    return set(re.findall(r"^\s*[\w:<>]+\s+(\w+)\s*(?:=[^;]*)?;", body, flags=re.M))


def cpp_calls(header, cls):
    """Public member functions of class <cls> (not constructors, operators, Impl)."""
    body = strip_comments(block(header, f"class {cls} {{"))
    public = body.split("private:")[0]
    names = set(re.findall(r"(\w+)\(", public))
    return {n for n in names if n not in (cls, "operator") and not n.startswith("~")} - {"Impl"}


def c_options(c_header, op):
    body = strip_comments(block(c_header, f"typedef struct fo_gemm_{op}_options {{"))
    return set(re.findall(r"(\w+);", body)) - {"struct_size", "reserved_"}


def c_functions(c_header, op):
    return set(re.findall(rf"FO_C_API fo_status fo_gemm_{op}_(\w+)\(", c_header))


def python_keywords(cls):
    sig = inspect.signature(cls.__init__)
    return {p.name for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY}


class Surfaces(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.header = read("include/flashoverlap/flashoverlap.h")
        cls.c_header = read("include/flashoverlap/flashoverlap_c.h")

    def test_every_option_has_one_name_on_every_surface(self):
        for op, name in OPS.items():
            with self.subTest(op=op):
                cpp = cpp_options(self.header, name)
                self.assertTrue(cpp, f"no options parsed for {name}")
                self.assertEqual(cpp - c_options(self.c_header, op), set(),
                                 f"{name}Options fields missing from fo_gemm_{op}_options")
                self.assertEqual(cpp - python_keywords(getattr(fot, name)), set(),
                                 f"{name}Options fields missing from flashoverlap.torch.{name}'s keywords")

    def test_every_call_exists_on_every_surface(self):
        for op, name in OPS.items():
            with self.subTest(op=op):
                calls = cpp_calls(self.header, name)
                self.assertIn("run", calls)
                c = c_functions(self.c_header, op)
                py = getattr(fot, name)
                for call in sorted(calls):
                    if call in ACCESSORS:
                        self.assertIn("shape", c, f"{name}::{call}: fo_gemm_{op}_shape")
                        continue
                    self.assertIn(call, c, f"{name}::{call} has no fo_gemm_{op}_{call}")
                    self.assertTrue(hasattr(py, PYTHON_NAMES.get(call, call)),
                                    f"{name}::{call} has no flashoverlap.torch.{name}.{PYTHON_NAMES.get(call, call)}")

    def test_every_free_function_exists_on_every_surface(self):
        # flashoverlap::<name>(...) at namespace level: fo_<name> in C, flashoverlap.<name> in Python (the
        # package's names, resolved lazily; a call on a communicator is a Communicator method there).
        body = strip_comments(self.header)
        names = set(re.findall(r"^[A-Za-z_:<>]+[ *&]+([a-z_]+)\(", body, flags=re.M))
        self.assertGreaterEqual(names, {"local_gpus", "allreduce_curve_path", "plan_gemm_allreduce",
                                        "plan_gemm_reducescatter", "plan_gemm_alltoall"})
        c = set(re.findall(r"FO_C_API \w+\*? ?(fo_\w+)\(", self.c_header))
        import flashoverlap
        for name in sorted(names):
            with self.subTest(function=name):
                self.assertIn(f"fo_{name}", c, f"flashoverlap::{name} has no fo_{name}")
                if name == "measure_allreduce_curve":
                    self.assertTrue(hasattr(fot._capi.Communicator, name), name)
                else:
                    self.assertIn(name, flashoverlap.__all__, f"flashoverlap::{name} is not flashoverlap.{name}")

    def test_the_nvlink_path_has_one_name(self):
        # (the C enum keeps FO_PATH_OWNERS as the AllReduce's former name for it)
        for op, name in COLLECTIVES.items():
            with self.subTest(op=op):
                paths = block(self.header, f"struct {name}Options {{")
                self.assertRegex(paths, r"enum class Path \{[^}]*\bNVLink\b")
        self.assertIn("nvlink", fot._capi.PATHS)
        self.assertIn("nvlink", fot._capi.RS_PATHS)
        self.assertIn("nvlink", fot._capi.A2A_PATHS)

    def test_the_parser_sees_what_it_should(self):
        # (a guard on this test itself: a header reshaped past its parsing would pass everything vacuously)
        self.assertGreaterEqual(cpp_options(self.header, "GemmAllReduce"),
                                {"path", "nccl_sms", "wait_timeout_s", "check_m", "curves", "tuning_cache"})
        self.assertGreaterEqual(cpp_calls(self.header, "GemmAllReduce"),
                                {"run", "run_rmsnorm", "register_output", "run_registered", "prepare", "plan", "check"})
        self.assertGreaterEqual(c_functions(self.c_header, "reducescatter"), {"run", "all_gather_rows", "rows_out"})


if __name__ == "__main__":
    unittest.main()
