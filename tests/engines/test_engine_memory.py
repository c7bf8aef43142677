"""What a vLLM engine takes of its node's memory when ``rollout.engine_kwargs`` do not say (``default_memory``): on CPUs
half of what the node has available, split among the engines placed there, and never more than its sequences can
fill; on GPUs vLLM's share of a device times the share its worker reserves. Plain arithmetic: no vLLM needed."""

from __future__ import annotations

from types import SimpleNamespace

from rayseq.engines.vllm_engine import default_memory, kv_bytes_per_token

GiB = 2**30
# the tiny test GPT-2 (tests/hf_fixtures.py, one head): 2 layers, 1 head of 32 dimensions, 128 positions
TINY = SimpleNamespace(num_hidden_layers=2, num_attention_heads=1, hidden_size=32, max_position_embeddings=128)
# a GPT-2 small: 12 layers, 12 heads of 64, 1024 positions
SMALL = SimpleNamespace(num_hidden_layers=12, num_attention_heads=12, hidden_size=768, max_position_embeddings=1024)


def cpu(config, engines=2, available=16 * GiB, **kwargs):
    return default_memory(config, 4, kwargs, on_cpu=True, engines_on_node=engines, gpu_share=0.0,
                          available_bytes=available, gpu_utilization=0.92)


def test_bytes_per_token():
    assert kv_bytes_per_token(TINY, 4) == 2 * 2 * 1 * 32 * 4  # keys and values, 2 layers, 1 head of 32, fp32: 512
    grouped = SimpleNamespace(num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, head_dim=64,
                              hidden_size=896)
    assert kv_bytes_per_token(grouped, 2) == 2 * 24 * 2 * 64 * 2  # grouped-query attention: the key/value heads


def test_cpu_engines_share_half_of_what_the_node_has():
    # a GPT-2 small's 256 sequences of 1024 (+128) tokens would fill 256 × 1152 × 72 KiB = 20.25 GiB: the share wins
    memory, why = cpu(SMALL, engines=2, available=16 * GiB)
    assert memory == {"kv_cache_memory_bytes": 4 * GiB}  # 16 GiB / 2 over 2 engines
    assert why == ("kv_cache_memory_bytes=4294967296 (4.00 GiB: 0.5 of the 16.0 GiB available on its node over its 2 "
                   "engines)")
    assert cpu(SMALL, engines=1, available=16 * GiB)[0] == {"kv_cache_memory_bytes": 8 * GiB}
    assert cpu(SMALL, engines=4, available=16 * GiB)[0] == {"kv_cache_memory_bytes": 2 * GiB}


def test_a_cpu_engine_takes_no_more_than_its_sequences_fill():
    memory, why = cpu(TINY)
    assert memory == {"kv_cache_memory_bytes": 512 * 256 * (128 + 128)}  # 32 MiB, not 4 GiB
    assert why.startswith("kv_cache_memory_bytes=33554432 (32 MiB: what 256 sequences of 128 tokens fill; at most 0.5")
    # vLLM's own length and batch keys bound it too
    assert cpu(SMALL, max_model_len=256, max_num_seqs=8)[0] == {"kv_cache_memory_bytes": 72 * 1024 * 8 * 384}


def test_gpu_engines_take_the_share_of_a_device_their_worker_reserves():
    def gpu(share):
        return default_memory(SMALL, 2, {}, on_cpu=False, engines_on_node=4, gpu_share=share, available_bytes=0,
                              gpu_utilization=0.92)

    assert gpu(1.0) == ({"gpu_memory_utilization": 0.92}, "gpu_memory_utilization=0.92 (vLLM's 0.92 of a device)")
    assert gpu(0.5) == ({"gpu_memory_utilization": 0.46},  # two engines on a device, or an engine and a learner
                        "gpu_memory_utilization=0.46 (vLLM's 0.92 of a device × the 0.5 its worker reserves)")
    assert gpu(0.25)[0] == {"gpu_memory_utilization": 0.23}
    assert gpu(2.0)[0] == {"gpu_memory_utilization": 0.92}  # tensor parallel over 2 devices: each device whole
