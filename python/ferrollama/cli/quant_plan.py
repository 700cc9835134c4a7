"""llama-quantize's choice of a type for each tensor (src/llama-quant.cpp: tensor_allows_quantization,
llama_tensor_get_type, tensor_type_fallback, tensor_requires_imatrix), for ``ferrollama quantize``.

A preset (a llama_ftype: Q4_K_M, IQ3_M, ...) names a default type; unless ``--pure``, the mix rules
then move some tensors to other types by their role (attn_v, ffn_down, output, ...), their layer,
the model's architecture, its experts and its grouped-query ratio; a row length that the type's
block does not divide falls back to a smaller block. The tensors are visited in llama.cpp's order
(by layer, then by name): some rules count the attn_v / ffn_down tensors seen so far.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

#: preset -> (llama_ftype id, default tensor type), as llama-quantize names them
PRESETS: dict[str, tuple[int, str]] = {
    "F32": (0, "F32"), "F16": (1, "F16"), "BF16": (32, "BF16"),
    "Q4_0": (2, "Q4_0"), "Q4_1": (3, "Q4_1"), "Q5_0": (8, "Q5_0"), "Q5_1": (9, "Q5_1"), "Q8_0": (7, "Q8_0"),
    "Q2_K": (10, "Q2_K"), "Q2_K_S": (21, "Q2_K"),
    "Q3_K_S": (11, "Q3_K"), "Q3_K_M": (12, "Q3_K"), "Q3_K_L": (13, "Q3_K"),
    "Q4_K_S": (14, "Q4_K"), "Q4_K_M": (15, "Q4_K"), "Q5_K_S": (16, "Q5_K"), "Q5_K_M": (17, "Q5_K"), "Q6_K": (18, "Q6_K"),
    "IQ2_XXS": (19, "IQ2_XXS"), "IQ2_XS": (20, "IQ2_XS"), "IQ2_S": (28, "IQ2_XS"), "IQ2_M": (29, "IQ2_S"),
    "IQ3_XXS": (23, "IQ3_XXS"), "IQ3_XS": (22, "IQ3_S"), "IQ3_S": (26, "IQ3_S"), "IQ3_M": (27, "IQ3_S"),
    "IQ1_S": (24, "IQ1_S"), "IQ1_M": (31, "IQ1_M"), "IQ4_NL": (25, "IQ4_NL"), "IQ4_XS": (30, "IQ4_XS"),
    "TQ1_0": (36, "TQ1_0"), "TQ2_0": (37, "TQ2_0"), "MXFP4_MOE": (38, "MXFP4"), "Q1_0": (40, "Q1_0"), "Q2_0": (41, "Q2_0"),
}
#: llama-quantize's aliases
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "MXFP4": "MXFP4_MOE"}
#: block sizes of the types a plan can name
BLOCK = {"F32": 1, "F16": 1, "BF16": 1, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "IQ4_NL": 32,
         "MXFP4": 32, "Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "IQ2_XXS": 256, "IQ2_XS": 256,
         "IQ2_S": 256, "IQ3_XXS": 256, "IQ3_S": 256, "IQ1_S": 256, "IQ1_M": 256, "IQ4_XS": 256, "TQ1_0": 256,
         "TQ2_0": 256, "Q1_0": 128, "Q2_0": 64}
#: tensor_type_fallback: the 32-block type of a 256-block type whose block does not divide the row
FALLBACK = {"IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL", "IQ2_S": "IQ4_NL",
            "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ4_XS": "IQ4_NL", "Q2_K": "Q4_0", "Q3_K": "Q4_0",
            "TQ1_0": "Q4_0", "TQ2_0": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_0": "Q4_0"}
#: tensor_requires_imatrix: types whose quantizer needs an importance matrix
NEEDS_IMATRIX = {"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"}
IQ2_FTYPES = {"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"}

#: names that are never quantized (tensor_allows_quantization)
_NEVER = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
          "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
          "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
          "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
          "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
          "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
          ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger",
          "a.rvq.codebook", "mm.a.code_embd")
_NEVER_GLM5_NEXT = ("hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
                    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight",
                    "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight")


def resolve_preset(name: str) -> str:
    upper = name.upper()
    return ALIASES.get(upper, upper)


def allows_quantization(name: str, n_dims: int, arch: str) -> bool:
    if n_dims < 2 or not name.endswith("weight"):
        return False
    if any(part in name for part in _NEVER) or name in ("position_embd.weight", "token_types.weight"):
        return False
    return not (arch == "glm5-next" and any(part in name for part in _NEVER_GLM5_NEXT))


def category(name: str) -> str:
    """tensor_get_category."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"), ("attn_v.weight", "attn_v"),
                      ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                      ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if part in name:
            return cat
    return "other"


def requires_imatrix(name: str, new_type: str, preset: str) -> bool:
    if category(name) in ("output", "token_embd"):
        return False
    return new_type in NEEDS_IMATRIX or (new_type == "Q2_K" and preset == "Q2_K_S")


def _use_more_bits(i_layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def llama_order(names: list[str]) -> list[str]:
    """llama_model_loader's weights_map order: by layer number (-1 outside the layers), then by name."""
    def key(n: str):
        m = re.match(r"blk\.(\d+)\.", n)
        return (int(m.group(1)) if m else -1, n.encode())
    return sorted(names, key=key)


@dataclass
class ModelFacts:
    """What the rules read of a model (llama_hparams / llm_arch / llm_type)."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int = 0
    is_70b: bool = False

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @staticmethod
    def of_fields(fields: dict) -> ModelFacts:
        """From a GGUF's metadata ({key: value}); per-layer head counts read at layer 0."""
        arch = fields["general.architecture"]
        get = lambda key, default=0: fields.get(f"{arch}.{key}", default)  # noqa: E731
        first = lambda v: int(v[0]) if isinstance(v, (list, tuple)) else int(v)  # noqa: E731
        n_layer = int(get("block_count"))
        n_head = first(get("attention.head_count"))
        n_head_kv = first(get("attention.head_count_kv", n_head))
        # llm_type 70B: the Llama 2/3 70B shape (80 layers, grouped-query attention)
        is_70b = arch == "llama" and n_layer == 80 and n_head != n_head_kv
        return ModelFacts(arch, n_layer, n_head, n_head_kv, int(get("expert_count")), is_70b)


@dataclass
class Planner:
    """llama_tensor_get_type over a model's tensors, with quantize_state_impl's counters."""

    facts: ModelFacts
    preset: str
    pure: bool = False
    has_imatrix: bool = False
    output_type: str | None = None
    embd_type: str | None = None
    has_tied_embeddings: bool = True
    n_attention_wv: int = 0
    counters: dict[str, int] = field(default_factory=lambda: {"attn_v": 0, "ffn_down": 0, "ffn_gate": 0, "ffn_up": 0})

    @property
    def default_type(self) -> str:
        return PRESETS[self.preset][1]

    def plan(self, tensors: list[tuple[str, tuple[int, ...], str]]) -> dict[str, str]:
        """{name: new type} for (name, ne (ggml order), current type) of every tensor."""
        names = llama_order([t[0] for t in tensors])
        by_name = {t[0]: t for t in tensors}
        self.n_attention_wv = sum(1 for n in names if category(n) in ("attn_v", "attn_qkv", "attn_kv_b"))
        self.has_tied_embeddings = "output.weight" not in by_name
        out = {}
        for name in names:
            _, ne, cur = by_name[name]
            out[name] = self.tensor_type(name, ne) if allows_quantization(name, len(ne), self.facts.arch) else cur
        return out

    def tensor_type(self, name: str, ne: tuple[int, ...]) -> str:
        cat = category(name)
        if self.embd_type and cat == "token_embd":
            return self.embd_type
        if self.output_type and cat == "output":
            return self.output_type
        new_type = self.default_type
        if new_type in ("F32", "F16", "BF16"):
            return new_type
        if not self.pure:
            new_type = self._mix(name, ne, cat, new_type)
        return fallback(new_type, ne[0])

    def _layer(self, counter: str, name: str) -> tuple[int, int]:
        """layer_info: the counter, or with experts the layer in the name."""
        i_layer = self.counters[counter]
        if max(1, self.facts.n_expert) > 1:
            m = re.match(r"blk\.(\d+)\.", name)
            if not m or not 0 <= int(m.group(1)) < self.facts.n_layer:
                raise ValueError(f"cannot determine the layer of {name}")
            i_layer = int(m.group(1))
        return i_layer, self.facts.n_layer

    def _mix(self, name: str, ne: tuple[int, ...], cat: str, new_type: str) -> str:  # noqa: C901
        ft, f, arch = self.preset, self.facts, self.facts.arch
        if arch == "glm5-next" and any(p in name for p in ("attn_q_a", "attn_q_b", "nextn.eh_proj")):
            if new_type not in ("F32", "BF16", "F16"):
                return "Q8_0"
        if cat == "output" or (self.has_tied_embeddings and cat == "token_embd"):
            if self.output_type:
                return self.output_type
            if ft == "MXFP4_MOE":
                return "Q8_0"
            if arch == "falcon" or ne[0] % BLOCK[new_type]:
                return "Q8_0"
            if ft in ("IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"):
                return "Q5_K"
            return new_type if new_type == "Q8_0" else "Q6_K"
        if ft == "MXFP4_MOE":
            expert_roles = cat in ("ffn_up", "ffn_gate", "ffn_down")
            if len(ne) > 2 and ne[2] > 1 and (arch != "bailingmoe3" or expert_roles):
                return "MXFP4"
            return "Q8_0"
        if cat == "token_embd":
            if self.embd_type:
                return self.embd_type
            if ft in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
                return "Q2_K"
            if ft in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
                return "IQ3_S"
            if ft in ("TQ1_0", "TQ2_0", "Q2_0"):
                return "Q4_K"
            return new_type
        if ft in IQ2_FTYPES:
            return self._mix_iq2(name, cat, new_type)
        if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            return self._mix_attn_v(new_type)
        if cat == "attn_k":
            if f.n_expert == 8:
                return "Q8_0"
            return {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}.get(ft, new_type)
        if cat == "attn_q":
            return {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}.get(ft, new_type)
        if cat == "ffn_down":
            return self._mix_ffn_down(name, new_type)
        if cat == "attn_output":
            return self._mix_attn_output(new_type)
        if cat in ("ffn_gate", "ffn_up"):
            i_layer, n_layer = self._layer(cat, name)
            self.counters[cat] += 1
            if ft == "IQ3_XS" and n_layer // 8 <= i_layer < 7 * n_layer // 8:
                return "IQ3_XXS"
        return new_type

    def _mix_iq2(self, name: str, cat: str, new_type: str) -> str:
        ft, f = self.preset, self.facts
        iq3s_or_q2k = "IQ3_S" if ft in ("IQ2_S", "IQ2_M") else "Q2_K"
        if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            self.counters["attn_v"] += 1
            return "Q4_K" if f.n_gqa >= 4 or f.n_expert >= 4 else iq3s_or_q2k
        if f.n_expert == 8 and cat == "attn_k":
            return "Q4_K"
        if cat == "ffn_down":
            i = self.counters["ffn_down"]
            self.counters["ffn_down"] += 1
            return iq3s_or_q2k if i < f.n_layer // 8 else new_type
        if cat == "attn_output":
            if f.n_expert == 8:
                return "Q5_K"
            if ft in ("IQ1_S", "IQ1_M"):
                return "IQ2_XXS"
            if ft in ("IQ2_S", "IQ2_M"):
                return "IQ3_S"
        return new_type

    def _mix_attn_v(self, new_type: str) -> str:
        ft, f = self.preset, self.facts
        i, n = self.counters["attn_v"], self.n_attention_wv
        gqa4 = f.n_gqa >= 4
        if ft == "Q2_K":
            new_type = "Q4_K" if gqa4 else "Q3_K"
        elif ft == "Q2_K_S" and gqa4:
            new_type = "Q4_K"
        elif ft == "IQ3_XXS":
            new_type = "Q4_K" if gqa4 else ("IQ3_S" if not self.has_imatrix else "IQ3_XXS")
        elif ft in ("IQ3_XS", "IQ3_S") and gqa4:
            new_type = "Q4_K"
        elif ft == "IQ3_M":
            new_type = "Q4_K"
        elif ft == "Q3_K_M":
            new_type = "Q5_K" if i < 2 else "Q4_K"
        elif ft == "Q3_K_L":
            new_type = "Q5_K"
        elif ft in ("IQ4_NL", "IQ4_XS") and gqa4:
            new_type = "Q5_K"
        elif ft in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, n):
            new_type = "Q6_K"
        elif ft == "Q4_K_S" and i < 4:
            new_type = "Q5_K"
        if f.is_70b and new_type in ("Q3_K", "Q4_K"):
            new_type = "Q5_K"
        if f.n_expert == 8:
            new_type = "Q8_0"
        self.counters["attn_v"] += 1
        return new_type

    def _mix_ffn_down(self, name: str, new_type: str) -> str:
        ft, f, falcon = self.preset, self.facts, self.facts.arch == "falcon"
        i_layer, n_layer = self._layer("ffn_down", name)
        self.counters["ffn_down"] += 1
        if ft == "Q2_K":
            return "Q3_K"
        if ft == "Q2_K_S":
            return "Q4_K" if i_layer < n_layer // 8 else new_type
        if ft == "IQ3_XXS" and not self.has_imatrix:
            return "Q4_K" if i_layer < n_layer // 8 else "Q3_K"
        if ft == "Q3_K_M":
            if i_layer < n_layer // 16:
                return "Q5_K"
            return "Q4_K" if not falcon or _use_more_bits(i_layer, n_layer) else "Q3_K"
        if ft == "IQ3_M" and (i_layer < n_layer // 8 or (f.n_expert == 8 and _use_more_bits(i_layer, n_layer))):
            return "Q4_K"
        if ft == "Q3_K_L":
            return "Q4_K" if falcon else "Q5_K"
        if ft == "Q4_K_M":
            if falcon:
                return "Q6_K" if i_layer < n_layer // 16 else "Q5_K" if _use_more_bits(i_layer, n_layer) else "Q4_K"
            return "Q6_K" if _use_more_bits(i_layer, n_layer) else new_type
        if i_layer < n_layer // 8 and ft in ("IQ4_NL", "IQ4_XS") and not self.has_imatrix:
            return "Q5_K"
        if ft == "Q5_K_M" and _use_more_bits(i_layer, n_layer):
            return "Q6_K"
        if ft == "Q4_K_S" and not falcon and i_layer < n_layer // 8:
            return "Q5_K"
        if ft in ("Q4_0", "Q5_0") and self.has_imatrix and i_layer < n_layer // 8:
            return "Q4_1" if ft == "Q4_0" else "Q5_1"
        return new_type

    def _mix_attn_output(self, new_type: str) -> str:
        ft, f = self.preset, self.facts
        if f.arch == "falcon":
            return "Q4_K" if ft == "Q3_K_L" else new_type
        if f.n_expert == 8:
            bumped = ("Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS")
            return "Q5_K" if ft in bumped else new_type
        return {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_M": "Q4_K"}.get(ft, new_type)


def fallback(new_type: str, n_cols: int) -> str:
    """tensor_type_fallback: a type whose block divides the row, or F16."""
    if n_cols % BLOCK[new_type] == 0:
        return new_type
    smaller = FALLBACK.get(new_type, new_type if BLOCK[new_type] <= 32 else None)
    if smaller is None:
        raise ValueError(f"no tensor type fallback is defined for type {new_type}")
    return smaller if n_cols % BLOCK[smaller] == 0 else "F16"
