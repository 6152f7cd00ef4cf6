"""Hugging Face Trainer and Accelerate on tpu with their defaults (fused AdamW, pinned DataLoader, accelerate's
torch.accelerator calls): losses and final parameters equal the same run on CPU."""
import time

import pytest
import torch
from torch.utils.data import Dataset

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

STEPS = 3


class RandomTokens(Dataset):
    def __init__(self, n: int, length: int, vocab: int, causal: bool):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)
        self.labels = self.ids.clone() if causal else torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(cfg), RandomTokens(24, 8, 64, causal=False)


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(cfg), RandomTokens(24, 8, 64, causal=True)


def train(factory, tmp_path, cpu: bool, **options):
    """Trainer with its defaults (optimizer, pin_memory, scheduler, clipping) on cpu or on the accelerator."""
    AcceleratorState._reset_state(reset_partial_state=True)
    torch.manual_seed(0)
    model, data = factory()
    args = TrainingArguments(str(tmp_path / ("cpu" if cpu else "tpu")), use_cpu=cpu, per_device_train_batch_size=4,
                             max_steps=STEPS, logging_steps=1, save_strategy="no", report_to=[], seed=0,
                             learning_rate=1e-2, disable_tqdm=True, **options)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    assert args.device.type == ("cpu" if cpu else "tpu")
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    params = {name: p.detach().cpu().float() for name, p in trainer.model.named_parameters()}
    AcceleratorState._reset_state(reset_partial_state=True)
    return trainer, losses, params


def _compare(factory, tmp_path, rtol=1e-4, atol=1e-5, **options):
    _, cpu_losses, cpu_params = train(factory, tmp_path, cpu=True, **options)
    trainer, losses, params = train(factory, tmp_path, cpu=False, **options)
    assert len(losses) == STEPS and len(cpu_losses) == STEPS
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=rtol, atol=atol)
    for name, value in cpu_params.items():
        torch.testing.assert_close(params[name], value, rtol=rtol, atol=atol, msg=name)
    for name, p in trainer.model.named_parameters():
        assert p.device.type == "tpu", name
    initial = factory_initial(factory)
    moved = sum(not torch.equal(params[n], initial[n]) for n in params)
    assert moved >= len(params) - 2, "the optimizer did not update the parameters"
    return trainer


def factory_initial(factory):
    torch.manual_seed(0)
    model, _ = factory()
    return {n: p.detach().float() for n, p in model.named_parameters()}


def test_trainer_defaults_bert_matches_cpu(tmp_path):
    # word embeddings end up to 1.9e-5 apart on an AVX-512/AMX host (float32 sums of their scattered
    # gradients in another order, then AdamW's normalized steps); 1e-5 held on the earlier hosts
    trainer = _compare(tiny_bert, tmp_path, atol=5e-5)
    assert trainer.args.optim.value == "adamw_torch_fused" and trainer.args.dataloader_pin_memory


def test_trainer_gradient_accumulation_matches_cpu(tmp_path):
    _compare(tiny_bert, tmp_path, gradient_accumulation_steps=2)


def test_trainer_torch_compile_tpu_backend_matches_cpu(tmp_path, monkeypatch):
    """torch_compile=True, torch_compile_backend="tpu": Accelerate accepts the name, the model runs as
    graphs of the tpu dynamo backend, and training equals CPU eager."""
    import tpu_interactive

    # TrainingArguments exports the backend to this variable; restore its absence afterwards
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "NO")
    _, cpu_losses, cpu_params = train(tiny_bert, tmp_path, cpu=True)
    before = tpu_interactive.stats()["compile_misses"]
    trainer, losses, params = train(tiny_bert, tmp_path, cpu=False, torch_compile=True, torch_compile_backend="tpu")
    assert tpu_interactive.stats()["compile_misses"] > before, "no graph went through the tpu dynamo backend"
    assert type(trainer.model_wrapped).__name__ == "OptimizedModule"
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-5)
    for name, value in cpu_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_accelerate_knows_the_tpu_dynamo_backend():
    from accelerate.utils import DynamoBackend, TorchDynamoPlugin

    assert DynamoBackend("TPU") is DynamoBackend.TPU is DynamoBackend["TPU"] and DynamoBackend.TPU in list(DynamoBackend)
    assert TorchDynamoPlugin(backend="tpu").to_kwargs()["backend"] == "tpu"
    with pytest.raises(ValueError, match="is not a valid DynamoBackend"):  # other unknown names: Accelerate's error
        TorchDynamoPlugin(backend="tpux")


@pytest.mark.slow
def test_trainer_defaults_llama_matches_cpu(tmp_path):
    _compare(tiny_llama, tmp_path)


@pytest.mark.slow
def test_trainer_bf16_matches_cpu_autocast(tmp_path):
    _compare(tiny_llama, tmp_path, rtol=3e-2, atol=3e-2, bf16=True)


def test_accelerator_picks_tpu_and_trains_in_bf16():
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        acc = accelerate.Accelerator(mixed_precision="bf16")
        assert acc.device.type == "tpu"
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        reference.load_state_dict(model.state_dict())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True)
        seen = []
        model[0].register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
        model, opt = acc.prepare(model, opt)
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        for _ in range(2):
            out = model(x.to(acc.device))  # accelerate converts the model's outputs back to float32
            assert seen[-1] == torch.bfloat16  # the Linear ran under tpu autocast
            loss = torch.nn.functional.mse_loss(out.float(), y.to(acc.device))
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                ref_loss = torch.nn.functional.mse_loss(reference(x).float(), y)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach(), rtol=2e-2, atol=2e-2)
        for p, q in zip(acc.unwrap_model(model).parameters(), reference.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=2e-2, atol=2e-2)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def _launched(values):
    state = accelerate.PartialState()
    t = torch.arange(4.0, device=state.device) * 2
    values.append((state.device.type, state.num_processes, t.sum().item()))


def test_notebook_launcher_one_process():
    AcceleratorState._reset_state(reset_partial_state=True)
    values = []
    try:
        accelerate.notebook_launcher(_launched, (values,), num_processes=1)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert values == [("tpu", 1, 12.0)]


def test_notebook_launcher_many_processes_refused_not_hung():
    """Forking a process that runs XLA hangs the workers: refused at once, naming what works."""
    AcceleratorState._reset_state(reset_partial_state=True)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"tpu_interactive\.launch\(fn, \*args, nprocs=2\)"):
        accelerate.notebook_launcher(_launched, ([],), num_processes=2)
    assert time.monotonic() - start < 5
    assert accelerate.notebook_launcher is accelerate.launchers.notebook_launcher
