"""torch_pjrt/tools/pytorch_tests.py (PyTorch's device-generic test files on pjrt and CPU) on a
small device-generic file written here: outcomes paired across devices, a crash recorded and
the run resumed after it, a decorator's device restriction kept out of the rate."""
import json
import textwrap

from torch_pjrt.tools import pytorch_tests

TINY = '''
import os
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, onlyCPU
from torch.testing._internal.common_utils import TestCase, run_tests


class TestTiny(TestCase):
    def test_add(self, device):
        self.assertEqual(torch.ones(2, device=device) + 1, torch.full((2,), 2.0, device=device))

    def test_fails_on_pjrt(self, device):
        self.assertEqual(torch.device(device).type, "cpu")

    def test_crashes_on_pjrt(self, device):
        if torch.device(device).type != "cpu":
            os._exit(3)

    def test_runs_after_the_crash(self, device):
        self.assertEqual(torch.zeros(3, device=device).sum().item(), 0)

    @onlyCPU
    def test_only_cpu(self, device):
        pass


instantiate_device_type_tests(TestTiny, globals())

if __name__ == "__main__":
    run_tests()
'''


def test_pairs_outcomes_and_survives_a_crash(tmp_path):
    (tmp_path / "repo" / "test").mkdir(parents=True)
    (tmp_path / "repo" / "test" / "test_tiny.py").write_text(textwrap.dedent(TINY))
    pytorch_tests.main(["--pytorch", str(tmp_path / "repo"), "--files", "test_tiny", "--timeout", "120",
                        "--json", str(tmp_path / "out.json"), "--out", str(tmp_path / "out.md")])
    result = json.loads((tmp_path / "out.json").read_text())["results"]["test_tiny"]
    assert result["cpu_passing"] == 4  # test_only_cpu is restricted to the CPU by its decorator
    assert result["device_restricted"] == 1
    assert result["pjrt_passing"] == 2  # test_add and the test after the crash
    assert sorted(k.split("::")[-1] for k in result["failures"]) == ["test_crashes_on_pjrt", "test_fails_on_pjrt"]
    assert [k.split("::")[-1] for k in result["crashes"]] == ["test_crashes_on_pjrt"]
    assert "| test_tiny | 4 | 2 | 50.0% | 1 | 1 | 0 |" in (tmp_path / "out.md").read_text()
