"""The pjrt process group inside the test process (world size 1, two local devices):
argument errors, the device rule, compiled functional collectives. Multi-process
behaviour is in test_distributed.py."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import torch_pjrt


@pytest.fixture
def group():
    dist.init_process_group("pjrt", rank=0, world_size=1, store=dist.HashStore())
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_backend_is_registered_for_pjrt_and_cpu():
    assert "pjrt" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["pjrt"] == "pjrt"
    assert dist.Backend.backend_capability["pjrt"] == ["cpu", "pjrt"]


def test_world_of_one_runs_xla_programs(group):
    assert group.mesh is not None and group.device_index == 0
    t = torch.arange(6.0, device="pjrt").view(2, 3)
    work = dist.all_reduce(t, dist.ReduceOp.MAX, async_op=True)
    assert work.wait() and work.is_completed() and work.is_success()
    assert torch.equal(work.get_future().wait()[0].cpu(), torch.arange(6.0).view(2, 3))
    out = torch.zeros(2, 3, device="pjrt")
    dist.all_gather_into_tensor(out, t)
    assert torch.equal(out.cpu(), t.cpu())


def test_cpu_tensors_go_to_the_groups_gloo(group):
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.ones(3))


def test_premul_sum_scales_then_sums(group):
    t = torch.arange(4.0, device="pjrt")
    dist.all_reduce(t, dist._make_nccl_premul_sum(2.0))
    assert torch.equal(t.cpu(), torch.arange(4.0) * 2)
    out = torch.zeros(4, device="pjrt")
    source = torch.arange(4.0, device="pjrt")
    dist.reduce_scatter_tensor(out, source, dist._make_nccl_premul_sum(torch.tensor([0.5])))
    assert torch.equal(out.cpu(), torch.arange(4.0) / 2) and torch.equal(source.cpu(), torch.arange(4.0))


def test_tensor_on_another_device_names_both(group):
    t = torch.ones(2, device="pjrt:1")
    with pytest.raises(RuntimeError, match=r"tensor is on pjrt:1, but this rank's device is pjrt:0"):
        dist.all_reduce(t)


def test_wrong_output_size_names_op(group):
    with pytest.raises(ValueError, match="all_gather_into_tensor.*output has 3 elements, expected 1 x 2"):
        dist.all_gather_into_tensor(torch.zeros(3, device="pjrt"), torch.ones(2, device="pjrt"))


def test_compiled_functional_collectives_are_one_graph(group):
    def f(x):
        y = fc.all_reduce(x * 2, "sum", group)
        return fc.reduce_scatter_tensor(fc.all_gather_tensor(y + 1, 0, group), "avg", 0, group)

    x = torch.arange(4.0, device="pjrt")
    before = torch_pjrt.compile_stats()["graphs"]
    out = torch.compile(f, backend="pjrt", fullgraph=True)(x)
    assert torch.equal(out.cpu(), torch.arange(4.0) * 2 + 1)
    assert torch_pjrt.compile_stats()["graphs"] == before + 1
    assert torch_pjrt.compile_stats()["collective_graphs"][-1]["path"] == "xla"


def test_spmd_graph_keeps_every_graph_feature(group):
    """A compiled training step with a collective runs as an SPMD program: random ops (seeds),
    a graph constant, a mutated buffer, a view input, 0-d outputs and the backward graph
    all behave as the same step compiled without the collective (a world of one: the sum
    over one rank is the identity)."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 4)
            self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

        def forward(self, x, reduce: bool):
            self.calls.add_(1)
            h = torch.nn.functional.dropout(self.lin(x), 0.5, training=True)
            if reduce:
                h = fc.all_reduce(h, "sum", group)
            return (h * torch.tensor(2.0)).square().mean(), h.sum()

    results = {}
    for reduce in (True, False):
        torch.manual_seed(0)
        net = Net().to("pjrt")
        x = torch.randn(6, 8, device="pjrt").t()  # a transposed view as input
        torch.pjrt.manual_seed(1)
        step = torch.compile(net, backend="pjrt", fullgraph=True)
        loss, total = step(x, reduce)
        loss.backward()
        results[reduce] = [loss.cpu(), total.cpu(), net.lin.weight.grad.cpu(), net.calls.cpu()]
    assert [g["path"] for g in torch_pjrt.compile_stats()["collective_graphs"][-2:]] == ["xla", "xla"]
    assert results[True][0].shape == () and int(results[True][3]) == 1
    for got, want in zip(results[True], results[False]):
        torch.testing.assert_close(got, want)


def test_compiled_collectives_on_another_device_name_both(group):
    f = torch.compile(lambda x: fc.all_reduce(x, "sum", group), backend="pjrt")
    with pytest.raises(Exception, match=r"runs on pjrt:1, but its collectives' process group uses pjrt:0"):
        f(torch.ones(2, device="pjrt:1"))


def test_spmd_graph_donates_mutated_inputs_and_views_see_writes(group):
    @torch.compile(backend="pjrt")
    def bump(buf, x):
        buf.add_(fc.all_reduce(x, "sum", group))
        return buf.sum()

    buf = torch.zeros(4, device="pjrt")
    alias = buf.view(2, 2)
    for step in range(3):
        assert float(bump(buf, torch.ones(4, device="pjrt"))) == 4.0 * (step + 1)
    assert torch.equal(buf.cpu(), torch.full((4,), 3.0)) and torch.equal(alias.cpu(), torch.full((2, 2), 3.0))
    assert torch_pjrt.compile_stats()["collective_graphs"][-1]["path"] == "xla"
