"""Hugging Face Transformers models on the tpu device vs the same models on CPU.

Tiny models built from configs (nothing is downloaded: HF_HUB_OFFLINE=1). Each is built on CPU under
a fixed seed, deep-copied and the copy moved to tpu, so both start from identical weights; then
forward (logits, loss), backward (every gradient), one AdamW step (every parameter) and greedy
``generate()`` must agree with CPU.
"""
from __future__ import annotations

import copy
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import TPU, execute_notebook, slow, stored_notebook  # noqa: E402

import transformers  # noqa: E402  (test dependency: transformers==5.24.0, accelerate==1.16.0)
from transformers.generation.configuration_utils import CompileConfig  # noqa: E402

import tpu_interactive  # noqa: E402

transformers.logging.set_verbosity_error()

VOCAB = 128
# f32 on both sides; XLA's reductions sum in another order than ATen's, so allow small drift
TOL = dict(rtol=1e-4, atol=2e-5)


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def _llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                   num_attention_heads=4, num_key_value_heads=2,  # grouped-query attention
                                   vocab_size=VOCAB, max_position_embeddings=32, attention_dropout=0.0,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return transformers.LlamaForCausalLM(cfg)


def _bert():
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                  num_attention_heads=2, vocab_size=VOCAB, max_position_embeddings=32,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForMaskedLM(cfg)


def _t5():
    cfg = transformers.T5Config(num_layers=2, num_decoder_layers=2, d_model=32, d_ff=64, num_heads=2,
                                d_kv=16, vocab_size=VOCAB, dropout_rate=0.0, relative_attention_num_buckets=8,
                                decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return transformers.T5ForConditionalGeneration(cfg)


BUILDERS = {"gpt2": _gpt2, "llama": _llama, "bert": _bert, "t5": _t5}


def _pair(name):
    torch.manual_seed(0)
    cpu = BUILDERS[name]()
    return cpu, copy.deepcopy(cpu).to(TPU)


def _batch(name):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 8), generator=gen)
    if name == "bert":  # masked LM: loss only on some positions
        labels = ids.clone()
        labels[:, ::2] = -100
        return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}
    if name == "t5":
        return {"input_ids": ids, "labels": torch.randint(3, VOCAB, (2, 6), generator=gen)}
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding in the second row exercises the attention mask
    return {"input_ids": ids, "labels": ids, "attention_mask": mask}


def _to(batch, device):
    return {k: v.to(device) for k, v in batch.items()}


def _close(actual, expected, what, **tol):
    assert actual.device.type == "tpu", f"{what} is on {actual.device}"
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), msg=lambda m: f"{what}: {m}",
                               **(tol or TOL))


# Llama training runs by default; GPT-2, BERT and T5 (the same loop over other architectures) with -m slow
@pytest.mark.parametrize("name", [name if name == "llama" else slow(name) for name in BUILDERS])
def test_forward_backward_adamw_match_cpu(name):
    cpu, tpu = _pair(name)
    assert all(p.device == TPU for p in tpu.parameters())
    batch = _batch(name)
    out_cpu = cpu(**batch)
    out_tpu = tpu(**_to(batch, TPU))
    _close(out_tpu.logits, out_cpu.logits, f"{name} logits")
    _close(out_tpu.loss, out_cpu.loss, f"{name} loss")

    out_cpu.loss.backward()
    out_tpu.loss.backward()
    tpu_params = dict(tpu.named_parameters())
    for pname, p in cpu.named_parameters():
        if p.grad is None:
            assert tpu_params[pname].grad is None, f"{name} {pname}: grad on tpu but not on CPU"
            continue
        _close(tpu_params[pname].grad, p.grad, f"{name} grad {pname}")

    # Adam's first update is lr * g / (|g| + eps): with the default eps=1e-8 a near-zero gradient's
    # rounding noise flips it by up to 2 * lr. eps=1e-3 keeps it proportional to g (bounded by lr * dg / eps).
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2, eps=1e-3)
    opt_tpu = torch.optim.AdamW(tpu.parameters(), lr=1e-2, eps=1e-3)
    opt_cpu.step()
    opt_tpu.step()
    for pname, p in cpu.named_parameters():
        _close(tpu_params[pname], p, f"{name} {pname} after AdamW")
    # the stepped model still agrees
    with torch.no_grad():
        _close(tpu(**_to(batch, TPU)).loss, cpu(**batch).loss, f"{name} loss after step")


# Llama uses the static KV cache (fixed shapes: the TPU-friendly way, few recompiles). transformers
# then torch.compiles its decoding step, by default with inductor: "static" turns that off (eager),
# "static-compiled" compiles it with our backend (compile_config=CompileConfig(backend="tpu")).
# Llama generation (eager and compiled) runs by default; GPT-2 and T5 with -m slow.
@pytest.mark.parametrize("name,cache", [slow("gpt2", "dynamic"), ("llama", "static"), ("llama", "static-compiled"),
                                        slow("t5", "dynamic")])
def test_greedy_generate_matches_cpu(name, cache):
    cpu, tpu = _pair(name)
    cpu.eval()
    tpu.eval()
    prompt = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    kwargs = dict(do_sample=False, max_new_tokens=8, min_new_tokens=8)  # min: no early stop on eos
    if cache.startswith("static"):
        kwargs.update(cache_implementation="static")
    expected = cpu.generate(prompt, attention_mask=torch.ones_like(prompt), disable_compile=True, **kwargs)
    if cache == "static-compiled":
        torch._dynamo.reset()
        tpu_interactive.backend.compiler.clear_cache()
        before = tpu_interactive.stats()
        kwargs.update(compile_config=CompileConfig(backend="tpu"))
    else:
        kwargs.update(disable_compile=True)
    actual = tpu.generate(prompt.to(TPU), attention_mask=torch.ones_like(prompt).to(TPU), **kwargs)
    if cache == "static-compiled":
        stats = tpu_interactive.stats()
        assert stats["compile_misses"] > before["compile_misses"], "generate() ran no graph compiled by the tpu backend"
        assert stats["compile_hits"] - before["compile_hits"] >= 6, "decoding steps should reuse the compiled graph"
        torch._dynamo.reset()
    assert actual.device.type == "tpu"
    assert expected.shape[1] >= 9, expected.shape  # really generated tokens
    assert actual.cpu().tolist() == expected.tolist()


def test_from_pretrained_device_map_tpu(tmp_path):
    """save_pretrained on CPU, then from_pretrained(..., device_map="tpu") (accelerate places weights)."""
    cpu, _ = _pair("llama")
    cpu.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map="tpu")
    assert {p.device for p in loaded.parameters()} == {TPU}
    assert {b.device for b in loaded.buffers()} == {TPU}
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _close(loaded(ids.to(TPU)).logits, cpu(ids).logits, "logits after device_map='tpu' load")


def test_from_pretrained_then_to_tpu_bf16(tmp_path):
    """The accelerate-free path: load on CPU, then .to('tpu'); here in bfloat16."""
    cpu, _ = _pair("gpt2")
    cpu.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).to("tpu")
    assert {(p.device, p.dtype) for p in loaded.parameters()} == {(TPU, torch.bfloat16)}
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = cpu.to(torch.bfloat16)(ids).logits
        actual = loaded(ids.to(TPU)).logits
    assert actual.dtype == torch.bfloat16
    _close(actual.float(), expected.float(), "bf16 logits", rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------- notebooks/transformers.ipynb
NOTEBOOK = "transformers.ipynb"


def _losses(book, kind: str) -> list[float]:
    import re

    text = "".join(o.get("text", "") for c in book.cells if c.cell_type == "code" for o in c.outputs
                   if o.output_type == "stream" and o.name == "stdout")
    return [float(v) for v in re.findall(rf"^{kind} step \d+: loss (\S+) ", text, flags=re.M)]


def test_notebook_is_stored_without_outputs():
    stored_notebook(NOTEBOOK)


def test_notebook_trains_eager_then_compiled():
    import math

    book = execute_notebook(NOTEBOOK, timeout=600)
    eager, compiled = _losses(book, "eager"), _losses(book, "compiled")
    assert len(eager) == 5 and len(compiled) == 5, (eager, compiled)
    losses = eager + compiled
    assert all(math.isfinite(v) for v in losses), losses
    assert all(b < a for a, b in zip(losses, losses[1:])), f"loss did not decrease every step: {losses}"
    assert losses[-1] < losses[0] - 0.5
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    generated = [o["text"] for o in outputs if o.output_type == "stream" and "generated:" in o.get("text", "")]
    assert generated and len(eval(generated[0].split("generated:")[1].splitlines()[0])) == 8
