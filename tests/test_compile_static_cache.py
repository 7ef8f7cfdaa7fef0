"""HF's static-cache recipe, StaticCache + torch.compile(model.forward, backend="pjrt"), and
the mechanism its decode step once failed on: a module-level cache of JAX scalars filled
inside one graph's trace kept that trace's tracers, and the next graph's trace (the decode
step) took them as extra inputs of its executable, which its callers never pass ("Execution
supplied 29 arguments but compiled program expected 34" on the second decode call)."""
import jax
import pytest
import torch

from torch_pjrt.ops import call
from torch_pjrt.runtime import storage
from torch_pjrt.tools.bench_llm import _cache_keyword

pytestmark = pytest.mark.usefixtures("fresh_compile")

NEW_TOKENS = 4


def test_scalar_caches_keep_no_tracer():
    """weak_scalar and offset_operand called inside a trace return that trace's value but
    cache nothing of it; outside a trace they still cache a concrete array."""
    number, offset = 12345.25, 987_654_321  # values no other test caches

    def traced(x):
        return x * call.weak_scalar(number) + storage.offset_operand(offset)

    jax.jit(traced).trace(jax.ShapeDtypeStruct((2,), jax.numpy.float32))
    assert not any(isinstance(v, jax.core.Tracer) for v in call._WEAK_SCALARS.values())
    assert not any(isinstance(v, jax.core.Tracer) for v in storage._OFFSETS.values())
    assert isinstance(call.weak_scalar(number), jax.Array) and not isinstance(call.weak_scalar(number), jax.core.Tracer)
    assert call.weak_scalar(number) is call.weak_scalar(number)  # cached outside a trace
    assert storage.offset_operand(offset) is storage.offset_operand(offset)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return transformers, transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _greedy(transformers, forward, model, prompt):
    """Greedy decode as the bench's compiled mode runs it: prefill, then one call per token."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=prompt.shape[1] + NEW_TOKENS)
    kwargs = {_cache_keyword(model): cache, "use_cache": True, "logits_to_keep": 1}
    tokens, logits = [], []
    with torch.no_grad():
        ids = prompt
        for _ in range(NEW_TOKENS):
            out = forward(input_ids=ids, **kwargs).logits[:, -1]
            ids = out.argmax(-1, keepdim=True)
            logits.append(out.cpu())
            tokens.append(ids.cpu())
    return torch.cat(tokens, 1), torch.stack(logits)


@pytest.mark.parametrize("batch,prompt_length", [(2, 16), (4, 32)])
def test_static_cache_compiled_decode_matches_cpu(batch, prompt_length):
    transformers, model = _tiny_llama()
    torch.manual_seed(1)
    prompt = torch.randint(0, 512, (batch, prompt_length))
    expected_tokens, expected_logits = _greedy(transformers, model.forward, model, prompt)

    # another compiled graph first: its trace runs before the model's, as in a bench or test process
    other = torch.compile(lambda x: (x * 0.5 + 2.0).softmax(-1), backend="pjrt")
    other(torch.ones(3, 5, device="pjrt")).cpu()

    pjrt_model = model.to("pjrt")
    tokens, logits = _greedy(transformers, torch.compile(pjrt_model.forward, backend="pjrt"), pjrt_model,
                             prompt.to("pjrt"))
    assert torch.equal(tokens, expected_tokens)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
    from torch_pjrt.compiler import compile_stats

    assert compile_stats()["calls"] >= NEW_TOKENS + 1  # prefill and every decode step ran compiled
