"""A tiny Llama made here, for the real-vLLM tests: nothing comes from a model hub.

    python make_model.py OUT_DIR      (with the vLLM environment's interpreter: transformers, tokenizers, torch)

2 layers, hidden 128, 4 heads of dim 32 (4 KV heads: tensor-parallel 2 splits them 2 + 2), vocab 1024, random
weights (seed 0, float32, safetensors); a byte-level BPE tokenizer trained here on ranktrace's own docs.
"""
from __future__ import annotations

import sys
from pathlib import Path

VOCAB = 1024


def corpus() -> list[str]:
    repo = Path(__file__).resolve().parents[2]
    texts = []
    for p in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        try:
            texts += [line for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError:
            pass
    return texts or ["the quick brown fox jumps over the lazy dog"] * 100


def main(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=256,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, tie_word_embeddings=False,
                      torch_dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
