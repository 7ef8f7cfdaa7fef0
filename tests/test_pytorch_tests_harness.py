"""torch_pjrt/tools/pytorch_tests.py (PyTorch's device-generic test files on pjrt and CPU) on a
small device-generic file written here: outcomes paired across devices, a crash recorded and
the run resumed after it, a decorator's device restriction (or a dtype instantiated only for the CPU) kept out of the rate, an
index error pjrt queues failing the test that queued it, a file's classes that are not
device-generic counted nowhere, the foreach samples' flags the 2023 test_foreach pops, a package of test/ the file imports copied beside it, a 2023
`super(self.__class__, self)` rewritten as meant, test_binary_ufuncs' class under its renamed name, and a file that does not import reported with its error instead of a rate."""
import json
import textwrap

from torch_pjrt.tools import pytorch_tests

TINY = '''
import os
import torch
from torch.testing._internal.common_device_type import dtypes, dtypesIfCPU, instantiate_device_type_tests, onlyCPU, ops
from torch.testing._internal.common_methods_invocations import foreach_pointwise_op_db
from torch.testing._internal.common_utils import TestCase, run_tests
from helpers.values import TWO  # a package of test/ the file imports: copied beside it


class TestPlain(TestCase):  # not device-generic: runs on the CPU in both runs, counted in neither
    def test_plain(self):
        pass


class TestTiny(TestCase):
    def setUp(self):  # as the 2023 test_linalg's: today's instantiation makes this call itself (the harness rewrites it)
        super(self.__class__, self).setUp()

    def test_add(self, device):
        self.assertEqual(torch.ones(2, device=device) + 1, torch.full((2,), TWO, device=device))

    def test_fails_on_pjrt(self, device):
        self.assertEqual(torch.device(device).type, "cpu")

    def test_fails_everywhere(self, device):  # not in the rate; with --only-cpu-passing not run on pjrt
        self.assertEqual(torch.device(device).type, "neither")

    def test_crashes_on_pjrt(self, device):
        if torch.device(device).type != "cpu":
            os._exit(3)

    def test_leaves_an_index_error_queued(self, device):
        try:
            torch.zeros(3, device=device)[torch.tensor([5], device=device)]
        except IndexError:
            pass  # the CPU raises here; pjrt queues the check (as CUDA queues its device asserts)

    def test_runs_after_the_crash(self, device):
        self.assertEqual(torch.zeros(3, device=device).sum().item(), 0)

    def test_conv_backend_convention(self, device):  # torch's answer for PrivateUse1, not CPU's
        expected = torch._C._ConvBackend.Slow2d
        self.assertEqual(torch._C._ConvBackend.Overrideable if device != "cpu" else expected, expected)

    # the foreach samples' flags as the July 2023 test_foreach pops them (torch 2.13's samples dropped them)
    @ops([op for op in foreach_pointwise_op_db if op.name == "_foreach_addcmul"], allowed_dtypes=(torch.float32,))
    def test_foreach_samples_as_in_2023(self, device, dtype, op):
        for sample in op.sample_inputs(device, dtype, num_input_tensors=[2]):
            self.assertFalse(sample.kwargs.pop("zero_size"))
            self.assertIn("disable_fastpath", sample.kwargs)
            self.assertIn("values", sample.kwargs)  # None, a scalar or a list of scalars (torch 2.13: value=, scalars=)

    @onlyCPU
    def test_only_cpu(self, device):
        pass

    @dtypesIfCPU(torch.float32, torch.float64)
    @dtypes(torch.float32)
    def test_dtypes(self, device, dtype):
        self.assertEqual(torch.ones(1, device=device, dtype=dtype).dtype, dtype)


instantiate_device_type_tests(TestTiny, globals())

if __name__ == "__main__":
    run_tests()
'''


def test_pairs_outcomes_and_survives_a_crash(tmp_path):
    (tmp_path / "repo" / "test").mkdir(parents=True)
    (tmp_path / "repo" / "test" / "test_tiny.py").write_text(textwrap.dedent(TINY))
    (tmp_path / "repo" / "test" / "helpers").mkdir()
    (tmp_path / "repo" / "test" / "helpers" / "values.py").write_text("TWO = 2.0\n")
    (tmp_path / "repo" / "test" / "test_broken.py").write_text("from torch.testing._internal.common_utils import no_such\n")
    pytorch_tests.main(["--pytorch", str(tmp_path / "repo"), "--files", "test_tiny,test_broken", "--timeout", "120",
                        "--json", str(tmp_path / "out.json"), "--out", str(tmp_path / "out.md")])
    result = json.loads((tmp_path / "out.json").read_text())["results"]["test_tiny"]
    # test_only_cpu and test_dtypes_float64 are restricted to the CPU by their decorators
    assert result["cpu_passing"] == 7
    assert result["device_restricted"] == 2
    # test_add, the test after the crash (not failed by the queued error), float32, the foreach samples
    assert result["pjrt_passing"] == 4
    assert sorted(k.split("::")[-1] for k in result["failures"]) == [
        "test_crashes_on_pjrt", "test_fails_on_pjrt", "test_leaves_an_index_error_queued"]
    assert "IndexError" in result["failures"][next(k for k in result["failures"] if "queued" in k)]["message"]
    assert [k.split("::")[-1] for k in result["crashes"]] == ["test_crashes_on_pjrt"]
    report = (tmp_path / "out.md").read_text()
    assert "| test_tiny | 7 | 4 | 57.1% | 2 | 1 | 1 | 0 |" in report
    assert len(result["by_convention"]) == 1 and "convolution_overrideable" in report
    # a file that does not import is said so, with its error, and has no rate
    assert "| test_broken | did not import: ImportError: cannot import name 'no_such'" in report


def test_only_cpu_passing_skips_on_pjrt_what_fails_on_the_cpu(tmp_path):
    (tmp_path / "repo" / "test" / "helpers").mkdir(parents=True)
    (tmp_path / "repo" / "test" / "test_tiny.py").write_text(textwrap.dedent(TINY))
    (tmp_path / "repo" / "test" / "helpers" / "values.py").write_text("TWO = 2.0\n")
    pytorch_tests.main(["--pytorch", str(tmp_path / "repo"), "--files", "test_tiny", "--timeout", "120",
                        "--select", "test_add or test_fails", "--only-cpu-passing", "--json", str(tmp_path / "out.json")])
    out = json.loads((tmp_path / "out.json").read_text())
    pjrt = {k.split("::")[-1]: r for k, r in out["tests"]["test_tiny"]["pjrt"].items() if k != "collected"}
    assert pjrt["test_fails_everywhere_pjrt"]["outcome"] == "skipped"
    assert "did not pass on the CPU" in pjrt["test_fails_everywhere_pjrt"]["message"]
    assert pjrt["test_add_pjrt"]["outcome"] == "passed" and pjrt["test_fails_on_pjrt_pjrt"]["outcome"] == "failed"
    result = out["results"]["test_tiny"]
    assert (result["cpu_passing"], result["pjrt_passing"], result["device_restricted"]) == (2, 1, 0)


def test_a_plugin_that_does_not_import_is_reported_not_rated(tmp_path, monkeypatch):
    """When `import torch` fails in the runs (a broken install of pjrt: the plugin imports torch), the
    file is reported with that error, not as 0 of 0 tests passing at 100%."""
    (tmp_path / "repo" / "test" / "helpers").mkdir(parents=True)
    (tmp_path / "repo" / "test" / "test_tiny.py").write_text(textwrap.dedent(TINY))
    (tmp_path / "repo" / "test" / "helpers" / "values.py").write_text("TWO = 2.0\n")
    (tmp_path / "broken" / "torch_pjrt").mkdir(parents=True)  # found before the installed one
    (tmp_path / "broken" / "torch_pjrt" / "__init__.py").write_text("raise ImportError('a broken install')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "broken"))
    pytorch_tests.main(["--pytorch", str(tmp_path / "repo"), "--files", "test_tiny", "--select", "test_add",
                        "--json", str(tmp_path / "out.json"), "--out", str(tmp_path / "out.md")])
    result = json.loads((tmp_path / "out.json").read_text())["results"]["test_tiny"]
    assert "Failed to load the backend extension: pjrt" in result["collection_error"]
    assert "| test_tiny | did not import: RuntimeError: Failed to load the backend extension" in (
        tmp_path / "out.md").read_text()


def test_a_convention_may_name_its_tests_and_unknown_device_skips_are_restricted():
    uint8 = {"test": "test_nn.py::TestNNDeviceTypePRIVATEUSE1::test_upsamplingBiMode2d_nonsupported_dtypes_antialias_"
                     "False_num_channels_3_mode_bilinear_uint8_pjrt_uint8", "outcome": "failed",
             "message": "AssertionError: RuntimeError not raised"}
    assert pytorch_tests._by_convention(uint8)
    # the same message from another test is a failure
    assert pytorch_tests._by_convention({**uint8, "test": uint8["test"].replace("bilinear_uint8", "nearest_int8")}) is None
    assert pytorch_tests._device_restricted({"outcome": "skipped", "message": "('x.py', 1, 'Skipped: Unknown device type')"})


def test_checks_made_on_the_device_follow_cudas_convention_only_in_the_tests_that_exempt_cuda():
    scatter = {"test": "test_torch.py::TestTorchDeviceTypePRIVATEUSE1::test_masked_scatter_pjrt_float32",
               "outcome": "failed", "message": "AssertionError: RuntimeError not raised"}
    assert pytorch_tests._by_convention(scatter)
    assert pytorch_tests._by_convention({**scatter, "test": "test_indexing.py::TestIndexingPRIVATEUSE1::"
                                         "test_trivial_fancy_out_of_bounds_pjrt",
                                         "message": "AssertionError: IndexError not raised"})
    # a test that does not exempt CUDA, or another failure of the same test, still fails
    assert pytorch_tests._by_convention({**scatter, "test": scatter["test"].replace("scatter_pjrt", "scatter_bool_tensor_pjrt")}) is None
    assert pytorch_tests._by_convention({**scatter, "message": "AssertionError: Tensor-likes are not equal!"}) is None
    assert pytorch_tests._by_convention({
        "test": "test_sort_and_select.py::TestSortAndSelectPRIVATEUSE1::test_stable_sort_against_numpy_pjrt_int16",
        "outcome": "failed", "message": "RuntimeError: Expected all tensors to be on the same device, but found at "
                                        "least two devices, pjrt:0 and cpu! (when checking argument 'index' in "
                                        "aten::index_fill.int_Scalar)"})


def test_the_device_modules_legacy_storage_class_is_a_convention_only_for_the_same_name():
    record = {"test": "test_torch.py::TestTorchDeviceTypePRIVATEUSE1::test_tensor_storage_type_pjrt_float32",
              "outcome": "failed",
              "message": "AssertionError: Type comparison failed: <class 'torch.pjrt.FloatStorage'> != "
                         "<class 'torch.FloatStorage'>"}
    assert pytorch_tests._by_convention(record)
    assert pytorch_tests._by_convention({**record, "message": record["message"].replace(
        "torch.FloatStorage'", "torch.DoubleStorage'")}) is None


BINARY_2023 = '''
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase


class TestBinaryUfuncs(TestCase):  # the 2023 name; today's OpInfo entries name TestBinaryUfuncsDevice
    @ops([op for op in op_db if op.name == "pow" and not op.variant_test_name], allowed_dtypes=(torch.complex64,))
    def test_reference_numerics(self, device, dtype, op):
        # pow's entry widens this test's complex64 tolerance (atol 1e-4); the default is 1e-5
        self.assertEqual(self.precision, 1e-4)


instantiate_device_type_tests(TestBinaryUfuncs, globals())
'''


def test_the_2023_binary_ufuncs_class_takes_the_opinfo_decorators_of_its_renamed_class(tmp_path):
    """test_binary_ufuncs' class is run under the name today's OpInfo entries give it, so their
    tolerances, skips and expected failures apply to it on both devices."""
    (tmp_path / "repo" / "test").mkdir(parents=True)
    (tmp_path / "repo" / "test" / "test_binary_ufuncs.py").write_text(textwrap.dedent(BINARY_2023))
    pytorch_tests.main(["--pytorch", str(tmp_path / "repo"), "--files", "test_binary_ufuncs", "--timeout", "120",
                        "--json", str(tmp_path / "out.json")])
    out = json.loads((tmp_path / "out.json").read_text())
    result = out["results"]["test_binary_ufuncs"]
    assert (result["cpu_passing"], result["pjrt_passing"]) == (1, 1), out["tests"]
