"""``transformers`` models from tiny configs: random weights, no downloads, every dropout off.

Sizes are chosen for the test budget (each Inductor compile of these graphs takes seconds on a 2-core CPU):
hidden size 32, 2 layers, 4 heads, vocabulary 128, batch 2, 8 tokens (12 for the second shape). Dropout
(and wav2vec2's SpecAugment masking and layer drop) is off, so a training step is deterministic and compiled
and eager runs can be compared. Attention is the models' default (SDPA). Decoders run with ``use_cache=False``
(the outputs are the logits, not cache objects).
"""

from __future__ import annotations

from typing import Any

import torch
import transformers as hf

from tests.zoo.spec import Spec, generator

__all__ = ["HF_SPECS"]

VOCAB, HIDDEN, LAYERS, HEADS, FFN = 128, 32, 2, 4, 64
BATCH, SEQ = 2, (8, 12)  # shape 0 and shape 1
SEED = 0


def _built(cls: type, config: Any) -> torch.nn.Module:
    torch.manual_seed(SEED)
    return cls(config)


def _ids(call: int, shape: tuple[int, ...], salt: int = 0, high: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=generator(call, salt))


def _loss(output: Any) -> torch.Tensor:
    return output.loss


# -- text encoders and decoders -----------------------------------------------------------------------------


def _bert() -> torch.nn.Module:
    config = hf.BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return _built(hf.BertForMaskedLM, config)


def _bert_inputs(call: int, shape: int) -> dict[str, Any]:
    seq = SEQ[shape]
    mask = torch.ones(BATCH, seq, dtype=torch.int64)
    mask[1, seq - 3 :] = 0  # the second sequence is padded: the padding mask reaches the attention
    return {"input_ids": _ids(call, (BATCH, seq)), "attention_mask": mask}


def _decoder_config(cls: type, **extra: Any) -> Any:
    return cls(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=64,
        **extra,
    )


def _causal_inputs(call: int, shape: int) -> dict[str, Any]:
    return {"input_ids": _ids(call, (BATCH, SEQ[shape])), "use_cache": False}


def _gpt2() -> torch.nn.Module:
    config = hf.GPT2Config(
        vocab_size=VOCAB,
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return _built(hf.GPT2LMHeadModel, config)


def _t5() -> torch.nn.Module:
    config = hf.T5Config(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        d_kv=HIDDEN // HEADS,
        d_ff=FFN,
        num_layers=LAYERS,
        num_heads=HEADS,
        dropout_rate=0.0,
        decoder_start_token_id=0,
    )
    return _built(hf.T5ForConditionalGeneration, config)


def _t5_inputs(call: int, shape: int) -> dict[str, Any]:
    seq = SEQ[shape]
    return {
        "input_ids": _ids(call, (BATCH, seq)),
        "decoder_input_ids": _ids(call, (BATCH, seq - 2), salt=2),
        "use_cache": False,
    }


def _seq2seq_train(inputs: dict[str, Any], call: int) -> dict[str, Any]:
    decoder_ids = inputs.pop("decoder_input_ids")  # the model shifts the labels right into the decoder inputs
    return {**inputs, "labels": _ids(call, decoder_ids.shape, salt=3)}


# -- vision ------------------------------------------------------------------------------------------------


def _vit() -> torch.nn.Module:
    config = hf.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        num_labels=5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return _built(hf.ViTForImageClassification, config)


def _vit_inputs(call: int, shape: int) -> dict[str, Any]:
    # The position embeddings fix the image size: the second shape is a larger batch.
    return {"pixel_values": torch.randn(BATCH + shape, 3, 16, 16, generator=generator(call))}


def _resnet() -> torch.nn.Module:
    config = hf.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=5
    )
    return _built(hf.ResNetForImageClassification, config)


def _resnet_inputs(call: int, shape: int) -> dict[str, Any]:
    side = (32, 24)[shape]  # the second shape changes the image size
    return {"pixel_values": torch.randn(BATCH, 3, side, side, generator=generator(call))}


def _image_train(inputs: dict[str, Any], call: int) -> dict[str, Any]:
    return {**inputs, "labels": torch.randint(0, 5, (inputs["pixel_values"].shape[0],), generator=generator(call, 3))}


# -- audio -------------------------------------------------------------------------------------------------


def _whisper() -> torch.nn.Module:
    config = hf.WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=8,
        d_model=HIDDEN,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN,
        max_source_positions=16,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )
    return _built(hf.WhisperForConditionalGeneration, config)


def _whisper_inputs(call: int, shape: int) -> dict[str, Any]:
    # The encoder takes exactly 2 * max_source_positions frames: the second shape is a longer decoder input.
    features = torch.randn(BATCH, 8, 32, generator=generator(call))
    decoder_ids = _ids(call, (BATCH, 6 + 3 * shape), salt=2)
    return {"input_features": features, "decoder_input_ids": decoder_ids, "use_cache": False}


def _wav2vec2() -> torch.nn.Module:
    config = hf.Wav2Vec2Config(
        vocab_size=16,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        conv_dim=(16, 16),
        conv_stride=(4, 2),
        conv_kernel=(8, 4),
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        feat_proj_dropout=0.0,
        final_dropout=0.0,
        layerdrop=0.0,
        mask_time_prob=0.0,
        pad_token_id=0,
        ctc_loss_reduction="mean",
    )
    return _built(hf.Wav2Vec2ForCTC, config)


def _wav2vec2_inputs(call: int, shape: int) -> dict[str, Any]:
    return {"input_values": torch.randn(BATCH, (400, 480)[shape], generator=generator(call))}


def _ctc_train(inputs: dict[str, Any], call: int) -> dict[str, Any]:
    labels = torch.randint(1, 16, (BATCH, 5), generator=generator(call, 3))
    labels[1, 3:] = -100  # a shorter target: CTC reads the label lengths from the -100 padding
    return {**inputs, "labels": labels}


def _lm_train(inputs: dict[str, Any], call: int) -> dict[str, Any]:
    return {**inputs, "labels": _ids(call, inputs["input_ids"].shape, salt=3)}


def _spec(name: str, build, inputs, train, **kwargs: Any) -> Spec:
    return Spec(name, build, inputs, lambda call: train(inputs(call, 0), call), _loss, **kwargs)


HF_SPECS: list[Spec] = [
    _spec("bert", _bert, _bert_inputs, _lm_train),
    _spec("gpt2", _gpt2, _causal_inputs, _lm_train),
    _spec("t5", _t5, _t5_inputs, _seq2seq_train),
    _spec("llama", lambda: _built(hf.LlamaForCausalLM, _decoder_config(hf.LlamaConfig)), _causal_inputs, _lm_train),
    # The sliding window (4) is shorter than both sequence lengths (8, 12): the window mask is exercised.
    _spec(
        "mistral",
        lambda: _built(hf.MistralForCausalLM, _decoder_config(hf.MistralConfig, sliding_window=4)),
        _causal_inputs,
        _lm_train,
    ),
    _spec("qwen2", lambda: _built(hf.Qwen2ForCausalLM, _decoder_config(hf.Qwen2Config)), _causal_inputs, _lm_train),
    _spec("vit", _vit, _vit_inputs, _image_train),
    _spec("resnet", _resnet, _resnet_inputs, _image_train),
    _spec("whisper", _whisper, _whisper_inputs, _seq2seq_train),
    _spec("wav2vec2", _wav2vec2, _wav2vec2_inputs, _ctc_train),
]
