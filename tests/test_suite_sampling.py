"""``TF2ONNX_RNN_TEST_SAMPLE`` (tests/conftest.py): the sample CI's oldest-stack slice runs keeps every test
with no parameters, the same cases every run, the same case in every test given it (they share a
conversion), and at least one case of every parametrized test."""
from __future__ import annotations

import importlib.util
import os
import types
import zlib


def _suite_conftest():
    """tests/conftest.py itself (``import conftest`` may give another folder's conftest, which pytest
    registered under that name first)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
    spec = importlib.util.spec_from_file_location("tf2onnx_rnn_suite_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


conftest = _suite_conftest()


def _item(function: str, case=None, module: str = "test_x"):
    item = types.SimpleNamespace(module=types.SimpleNamespace(__name__=module), originalname=function,
                                 nodeid=f"{module}.py::{function}" + (f"[{case}]" if case is not None else ""))
    if case is not None:
        item.callspec = types.SimpleNamespace(id=case)
    return item


CASES = [f"keras2-case{n}" for n in range(40)]


def _ids(items) -> list:
    return [item.nodeid for item in items]


def test_one_in_n_cases_by_their_id_and_every_plain_test():
    items = [_item("test_plain")] + [_item("test_a", case) for case in CASES]
    kept, dropped = conftest._sampled(items, 3)
    wanted = {case for case in CASES if zlib.crc32(case.encode()) % 3 == 0}
    assert 0 < len(wanted) < len(CASES)
    assert _ids(kept) == ["test_x.py::test_plain"] + [f"test_x.py::test_a[{case}]" for case in CASES if case in wanted]
    assert len(kept) + len(dropped) == len(items)
    assert _ids(conftest._sampled(list(reversed(items)), 3)[0]) == list(reversed(_ids(kept)))  # not by position


def test_the_tests_of_one_case_stay_together_and_each_test_keeps_one():
    unlucky = next(case for case in CASES if zlib.crc32(case.encode()) % 5 != 0)
    items = ([_item("test_a", case) for case in CASES] + [_item("test_b", case) for case in CASES]
             + [_item("test_c", unlucky), _item("test_a", unlucky, module="test_y")])
    kept, _ = conftest._sampled(items, 5)
    by_function: dict = {}
    for item in kept:
        by_function.setdefault((item.module.__name__, item.originalname), set()).add(item.callspec.id)
    assert by_function[("test_x", "test_a")] == by_function[("test_x", "test_b")]
    assert by_function[("test_x", "test_c")] == {unlucky}  # its only case, though it hashes elsewhere
    assert by_function[("test_y", "test_a")] == {unlucky}  # another module's test is its own


def test_a_sample_of_one_keeps_everything():
    items = [_item("test_plain")] + [_item("test_a", case) for case in CASES]
    assert conftest._sampled(items, 1) == (items, [])
