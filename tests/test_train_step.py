"""tpu_interactive.compile_train_step: a whole training step (forward, loss, backward, optimizer) as one
jitted program, checked against the same steps run eagerly on CPU."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import TPU, assert_same, slow, to_tpu, tol_for
from test_compile import FACTORIES, _inputs, _loss

import tpu_interactive as tt
from tpu_interactive.backend import compiler as tcompile

# Adam's eps is raised from 1e-8: some gradients are exactly 0 in exact arithmetic (the key bias of
# attention: softmax ignores a constant shift) and ~1e-9 rounding noise on both CPU and tpu; with
# eps=1e-8 Adam would scale that noise up to full-size, different updates.
OPTIMIZERS = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, eps=1e-4),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, eps=1e-4, weight_decay=0.1),
}


@pytest.fixture(autouse=True)
def _fresh_cache():
    tcompile.clear_cache()
    yield


def _train_step_events(step):
    return [e for e in tt.stats()["recent_compiles"] if e["name"] == step.name]


def _pair(factory, make_opt, seed=0):
    torch.manual_seed(seed)
    cpu = factory()
    dev = copy.deepcopy(cpu).to(TPU)
    return cpu, dev, make_opt(cpu.parameters()), make_opt(dev.parameters())


def _cpu_step(model, opt, loss_fn, *batch):
    opt.zero_grad()
    loss = loss_fn(model, *batch)
    loss.backward()
    opt.step()
    return loss.detach()


def _assert_models_equal(dev, cpu):
    # several training steps of float32 math: "accumulated" drift
    for (name, p_cpu), p_dev in zip(cpu.named_parameters(), dev.parameters()):
        assert_same(p_dev.detach(), p_cpu.detach(), tol="accumulated"), name
    for (name, b_cpu), b_dev in zip(cpu.named_buffers(), dev.buffers()):  # BatchNorm running stats
        assert_same(b_dev, b_cpu, tol="accumulated"), name


# Every model with SGD-momentum and the MLP with Adam run by default; the other Adam/AdamW pairs are
# slow twins (Adam's and AdamW's capturable paths are also covered by the other train-step tests).
@pytest.mark.parametrize("kind,opt_name", [
    (kind, opt) if opt == "sgd-momentum" or (kind, opt) == ("mlp", "adam") else slow(kind, opt)
    for kind in ("mlp", "conv", "block") for opt in OPTIMIZERS])
def test_matches_cpu_training(kind, opt_name, no_fallback):
    cpu, dev, opt_cpu, opt_dev = _pair(FACTORIES[kind], OPTIMIZERS[opt_name])
    x, target = _inputs(kind)

    def loss_fn(model, x, target):
        return _loss(kind, model(x), target)

    step = tt.compile_train_step(dev, loss_fn, opt_dev)
    for _ in range(4):  # 1 eager (creates the optimizer state), 1 compile, 2 cache hits
        loss_cpu = _cpu_step(cpu, opt_cpu, loss_fn, x, target)
        loss_dev = step(to_tpu(x), to_tpu(target))
        assert loss_dev.device.type == "tpu" and loss_dev.grad_fn is None
        assert_same(loss_dev, loss_cpu, tol="accumulated")
    _assert_models_equal(dev, cpu)
    for s_cpu, s_dev in zip(opt_cpu.state.values(), opt_dev.state.values()):
        for key, value in s_cpu.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(s_dev[key].cpu().to(value.dtype), value, **tol_for(value.dtype, "accumulated"))
    events = _train_step_events(step)
    assert [e["hit"] for e in events] == [False, True, True], events
    assert events[0]["cause"] == "first compile"


def test_one_program_per_step_and_no_grad_left_behind():
    cpu, dev, _, opt = _pair(FACTORIES["mlp"], OPTIMIZERS["adam"])
    x, target = (to_tpu(v) for v in _inputs("mlp"))
    step = tt.compile_train_step(dev, lambda m, x, t: F.mse_loss(m(x), t), opt)
    step(x, target), step(x, target)
    before = tt.stats()
    step(x, target)
    after = tt.stats()
    assert after["compile_hits"] - before["compile_hits"] == 1  # the whole step: one jitted call
    assert sum(after["op_counts"].values()) == sum(before["op_counts"].values())  # and no eager ops
    assert all(p.grad is None for p in dev.parameters())


def test_recompiles_with_causes_and_stays_correct():
    cpu, dev, opt_cpu, opt_dev = _pair(FACTORIES["mlp"], OPTIMIZERS["sgd-momentum"])

    def loss_fn(model, x, target):
        return F.mse_loss(model(x), target)

    step = tt.compile_train_step(dev, loss_fn, opt_dev)
    torch.manual_seed(3)
    small, large = (torch.randn(4, 6), torch.randn(4, 3)), (torch.randn(9, 6), torch.randn(9, 3))
    sched_cpu = torch.optim.lr_scheduler.StepLR(opt_cpu, step_size=3, gamma=0.5)
    sched_dev = torch.optim.lr_scheduler.StepLR(opt_dev, step_size=3, gamma=0.5)
    for batch in (small, small, large, large, small):
        assert_same(step(*to_tpu(batch)), _cpu_step(cpu, opt_cpu, loss_fn, *batch), tol="accumulated")
        sched_cpu.step(), sched_dev.step()
    _assert_models_equal(dev, cpu)
    causes = [e["cause"] for e in _train_step_events(step) if not e["hit"]]
    assert causes[0] == "first compile"
    assert causes[1] == "changed: batch shapes/dtypes"
    assert causes[2] == "optimizer param_groups[0].lr: 0.1 -> 0.05"
    # back to a shape seen before with the new lr: a recompile too (lr is part of the program)
    assert len(causes) == 4


def test_gradient_clipping_matches_clip_grad_norm():
    cpu, dev, opt_cpu, opt_dev = _pair(FACTORIES["block"], OPTIMIZERS["sgd-momentum"])
    x, target = _inputs("block")

    def loss_fn(model, x, target):
        return _loss("block", model(x), target)

    step = tt.compile_train_step(dev, loss_fn, opt_dev, max_grad_norm=0.5)
    for _ in range(3):
        opt_cpu.zero_grad()
        loss_cpu = loss_fn(cpu, x, target)
        loss_cpu.backward()
        norm = torch.nn.utils.clip_grad_norm_(cpu.parameters(), 0.5)
        assert norm > 0.5  # the clip is active: the test would see an unclipped update
        opt_cpu.step()
        assert_same(step(to_tpu(x), to_tpu(target)), loss_cpu.detach(), tol="accumulated")
    _assert_models_equal(dev, cpu)


def test_tensor_lr_schedule_runs_without_recompiling():
    """lr=torch.tensor(...) (what torch recommends for compiled optimizers) is a program input: the
    scheduler's in-place updates reach the program without a recompile."""
    def make_opt(ps):
        return torch.optim.AdamW(ps, lr=torch.tensor(1e-2), eps=1e-4, weight_decay=0.1)

    cpu, dev, opt_cpu, opt_dev = _pair(FACTORIES["mlp"], make_opt)
    sched_cpu = torch.optim.lr_scheduler.LambdaLR(opt_cpu, lambda epoch: 0.8 ** epoch)
    sched_dev = torch.optim.lr_scheduler.LambdaLR(opt_dev, lambda epoch: 0.8 ** epoch)
    x, target = _inputs("mlp")

    def loss_fn(model, x, target):
        return F.mse_loss(model(x), target)

    step = tt.compile_train_step(dev, loss_fn, opt_dev)
    for _ in range(5):
        assert_same(step(to_tpu(x), to_tpu(target)), _cpu_step(cpu, opt_cpu, loss_fn, x, target), tol="accumulated")
        sched_cpu.step(), sched_dev.step()
    _assert_models_equal(dev, cpu)
    assert [e["hit"] for e in _train_step_events(step)] == [False, True, True, True]


def test_host_read_of_a_tensor_lr_is_a_clear_error():
    model = nn.Linear(3, 2).to(TPU)
    opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1))  # SGD does lr.item() on the host
    step = tt.compile_train_step(model, lambda m, x: m(x).square().mean(), opt)
    x = torch.ones(2, 3, device=TPU)
    step(x)
    with pytest.raises(NotImplementedError, match=r"reads a tensor's value on the host .* SGD does this "
                                                  r"with a tensor lr: use a float lr"):
        step(x)


def test_train_eval_mode_is_guarded():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.5), nn.Linear(16, 3)).to(TPU)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay, only the mode matters
    x, target = (to_tpu(v) for v in _inputs("mlp"))
    step = tt.compile_train_step(model, lambda m, x, t: F.mse_loss(m(x), t), opt)
    step(x, target)
    train_losses = {step(x, target).item() for _ in range(3)}
    assert len(train_losses) == 3, "dropout draws a new mask every step"
    model.eval()
    with torch.no_grad():
        expected = F.mse_loss(model(x), target)
    assert_same(step(x, target), expected.cpu(), 1e-6, 1e-6)
    assert _train_step_events(step)[-1]["cause"] == "changed: module train/eval modes"


def test_dropout_reproducible_under_manual_seed():
    def run():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.3), nn.Linear(16, 3)).to(TPU)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        step = tt.compile_train_step(model, lambda m, x, t: F.mse_loss(m(x), t), opt)
        x, target = (to_tpu(v) for v in _inputs("mlp"))
        torch.manual_seed(7)
        return [step(x, target).item() for _ in range(4)]

    assert run() == run()


def test_tied_weights_and_frozen_parameters():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 8)
            self.mid = nn.Linear(8, 8)
            self.head = nn.Linear(8, 11, bias=False)
            self.head.weight = self.emb.weight  # one parameter, used twice
            self.mid.bias.requires_grad_(False)  # frozen: not in the optimizer, never updated

        def forward(self, idx):
            return self.head(torch.tanh(self.mid(self.emb(idx))))

    def make_opt(model):
        return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)

    torch.manual_seed(0)
    cpu = Tied()
    dev = copy.deepcopy(cpu).to(TPU)
    assert dev.head.weight is dev.emb.weight
    opt_cpu, opt_dev = make_opt(cpu), make_opt(dev)
    idx, target = torch.randint(0, 11, (3, 5)), torch.randint(0, 11, (3, 5))

    def loss_fn(model, idx, target):
        return F.cross_entropy(model(idx).reshape(-1, 11), target.reshape(-1))

    step = tt.compile_train_step(dev, loss_fn, opt_dev)
    for _ in range(3):
        assert_same(step(to_tpu(idx), to_tpu(target)), _cpu_step(cpu, opt_cpu, loss_fn, idx, target), tol="accumulated")
    _assert_models_equal(dev, cpu)
    assert dev.head.weight is dev.emb.weight


def test_state_dict_round_trip_after_compiled_steps():
    cpu, dev, opt_cpu, opt_dev = _pair(FACTORIES["mlp"], OPTIMIZERS["adam"])
    x, target = _inputs("mlp")

    def loss_fn(model, x, target):
        return F.mse_loss(model(x), target)

    step = tt.compile_train_step(dev, loss_fn, opt_dev)
    for _ in range(3):
        step(to_tpu(x), to_tpu(target))
        _cpu_step(cpu, opt_cpu, loss_fn, x, target)
    # the device checkpoint restores into a fresh CPU model and optimizer, which then trains on in step
    restored = copy.deepcopy(cpu)
    restored.load_state_dict({k: v.cpu() for k, v in dev.state_dict().items()})
    opt_restored = OPTIMIZERS["adam"](restored.parameters())
    saved = opt_dev.state_dict()
    assert saved["param_groups"][0]["capturable"] is False  # as the eager optimizer saves it
    assert all(st["step"].device.type == "cpu" for st in saved["state"].values())
    assert all(st["step"].device.type == "tpu" for st in opt_dev.state.values())  # live state untouched
    opt_restored.load_state_dict(copy.deepcopy(saved))  # torch shares 'step' tensors with the dict
    cpu_at_3, opt_state_at_3 = copy.deepcopy(cpu), copy.deepcopy(opt_cpu.state_dict())
    for _ in range(2):
        expected = _cpu_step(cpu, opt_cpu, loss_fn, x, target)
        got = _cpu_step(restored, opt_restored, loss_fn, x, target)
        torch.testing.assert_close(got, expected, **tol_for(expected.dtype, "accumulated"))
    # and the device optimizer resumes from its own checkpoint (capturable again, one recompile)
    opt_at_3 = OPTIMIZERS["adam"](cpu_at_3.parameters())
    opt_at_3.load_state_dict(opt_state_at_3)
    opt_dev.load_state_dict(copy.deepcopy(saved))
    for _ in range(2):
        expected = _cpu_step(cpu_at_3, opt_at_3, loss_fn, x, target)
        assert_same(step(to_tpu(x), to_tpu(target)), expected, tol="accumulated")
    _assert_models_equal(dev, cpu_at_3)


def test_optimizer_over_other_tensors_is_a_clear_error():
    model = nn.Linear(3, 2).to(TPU)
    stray = torch.zeros(4, device=TPU, requires_grad=True)
    opt = torch.optim.SGD(list(model.parameters()) + [stray], lr=0.1)
    step = tt.compile_train_step(model, lambda m, x: (m(x).sum() + stray.sum()), opt)
    x = torch.ones(2, 3, device=TPU)
    step(x)
    with pytest.raises(ValueError, match=r"compile_train_step: the optimizer holds tensors that are not "
                                         r"trainable parameters of the model \(shapes \[\(4,\)\]\)"):
        step(x)


def test_bf16_autocast_in_the_loss_matches_eager_amp_training():
    """``torch.autocast("tpu")`` inside the loss function, attention included: the step's program
    trains as eager AMP does. Under torch.func.grad an op that the autocast kernel's op runs (the SDPA
    decomposition's bmm) reached autocast again at the inner level, was cast there, and the backward
    failed ("expected scalar type BFloat16 but found Float")."""
    torch.manual_seed(0)
    eager = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).to(TPU)
    compiled = copy.deepcopy(eager)
    x, y = torch.randn(4, 6, 32).to(TPU), torch.randn(4, 6, 32).to(TPU)

    def loss_fn(model, a, b):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            return F.mse_loss(model(a).float(), b)

    # SGD: an update in proportion to its gradient (Adam's normalised one turns bf16 rounding noise of a
    # near-zero gradient into a full-size step of either sign)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (eager, compiled)]
    step = tt.compile_train_step(compiled, loss_fn, opts[1])
    for _ in range(3):
        opts[0].zero_grad()
        want = loss_fn(eager, x, y)
        want.backward()
        opts[0].step()
        got = step(x, y)
        torch.testing.assert_close(got.cpu(), want.detach().cpu(), rtol=2e-2, atol=1e-3)
    for p, q in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach().cpu(), rtol=2e-2, atol=2e-3)
    assert [e["cause"] for e in _train_step_events(step) if not e["hit"]] == ["first compile"]
