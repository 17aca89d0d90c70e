"""The record types every family module fills in and ``pretrain.registry`` looks up.

- ``Implementation``: everything the application knows about one paddlenlp ``model_type`` (its classes,
  how to read its shape, the facts the planner, preflight, the layout rules, LoRA, the routing and the
  Hugging Face export/import read), with ``DecoderShape``/``LatentAttention`` (its parameter shapes),
  ``Routing`` (a mixture of experts' routers) and ``HFFormat`` (its transformers class);
- ``Family``: a published family (LLaMA, Baichuan, ...) on one ``Implementation`` object;
- ``ModelSize``: a named size of a family, made by ``Family.size``;
- ``PublishedTokenizer``: a family's published tokenizer and where it comes from offline.

The records hold the objects they refer to (a family its implementation, a size its family's
implementation), so no record looks a name up in a table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from paddlenlp.transformers import PretrainedConfig

# ``Implementation.rope_cache_rows``: how many positions the RoPE tables of each attention layer hold on the device
ROPE_ROWS_SEQUENCE = "sequence"
ROPE_ROWS_TWICE_SEQUENCE = "twice the sequence"


@dataclass(frozen=True)
class HFFormat:
    """How one ``model_type`` meets Hugging Face ``transformers`` (pretrain.hf_export, pretrain.hf_import).

    The tensor names and layouts come from paddlenlp's own ``model_class._get_name_mappings``
    (Hugging Face name -> paddlenlp name, with a transpose or a q/k/v split), used in both directions.

    ``architecture``/``model_type``: the transformers class an export writes (no custom code needed).
    ``imports``: the ``architectures`` of a Hugging Face config.json this implementation reads.
    ``config``: paddlenlp config -> the transformers config.json fields of ``architecture``; RoPE as
    ``rope_parameters`` (``{"rope_type", "rope_theta", ...}``), which the export writes in the forms of
    transformers 4.x and 5 (``pretrain.hf_import.rope_config_fields``).
    ``unexportable``: paddlenlp config -> why no transformers class can express it, or None.
    ``rename``: when ``architecture`` is not the layout paddlenlp's mappings name (Qwen v1 -> Qwen2):
    ``(name, array, config) -> [(name, array), ...]`` applied after the mappings, else None.
    ``unimportable``: a Hugging Face config.json (dict; its RoPE, in either form, as ``rope_parameters``:
    ``pretrain.hf_import.read_rope``) -> why paddlenlp's class cannot compute it, or None.
    ``config_from_hf``: that dict -> paddlenlp config values its config class does not read by itself.
    ``from_hf``: the inverse of ``rename`` on import, else None: ``(tensors, config, read) -> tensors``, with
    ``tensors`` one Hugging Face file's ``{name: array}`` before the mappings and ``read(name)`` the array of a
    tensor of the folder (in whichever file holds it).
    ``hf_shape``: (transformers name, shape the mappings give it) -> the shape its folder holds, where ``rename``
    and ``from_hf`` reshape it (ERNIE-4.5-MoE's routing bias: [1, experts] for paddlenlp's [experts]).
    """

    architecture: str
    model_type: str
    imports: tuple
    config: Callable
    unexportable: Callable = lambda config: None
    rename: Optional[Callable] = None
    unimportable: Callable = lambda hf_config: None
    config_from_hf: Callable = lambda hf_config: {}
    from_hf: Optional[Callable] = None
    hf_shape: Callable = lambda name, shape: shape


@dataclass(frozen=True)
class DecoderShape:
    """Everything about a decoder-only transformer that decides its parameter count (elements)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    query_size: int  # query heads x head size
    key_value_size: int  # key/value heads x head size
    mlp_width: int  # hidden units of the MLP; mixture of experts: of those one token uses (top-k x expert + shared)
    gated_mlp: bool  # SwiGLU (gate, up, down matrices) instead of up, down
    qkv_bias: bool
    output_bias: bool  # attention output and MLP biases
    norm_has_bias: bool  # LayerNorm instead of RMSNorm
    position_rows: int  # learned absolute position embeddings; 0 for RoPE / ALiBi
    tie_word_embeddings: bool
    # Mixture of experts (zeros for a dense decoder): each MoE layer replaces the dense MLP by a router
    # (the planner's activations and step time read ``mlp_width``, a token's matmuls as one dense MLP)
    # [hidden, experts], ``experts`` gated MLPs of ``expert_width`` of which each token uses
    # ``experts_per_token``, and always-used shared experts of ``shared_expert_width`` hidden units in all.
    experts: int = 0
    experts_per_token: int = 0
    expert_width: int = 0
    shared_expert_width: int = 0
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert: Linear(hidden, 1)
    router_bias: bool = False  # DeepSeek-V3's e_score_correction_bias [experts] beside each router
    # The order a built decoder layer registers its parameters in (paddle's sharding stage2 partitions tensors
    # greedily in that order): attention, MLP, then the two norms as paddlenlp's LLaMA-style layers, unless
    # ``norms_first`` (QWen v1's ln_1, attn, ln_2, mlp); the router after the experts (paddlenlp's MoELayer,
    # DeepseekV2MoE), unless ``router_first`` (MixtralSparseMoeBlock)
    norms_first: bool = False
    router_first: bool = False
    # Indices of the layers whose MLP is dense (``dense_mlp_width`` hidden units, gated) in a mixture of experts:
    # DeepSeek's first_k_dense_replace leading layers (and those moe_layer_freq skips), Qwen3-MoE's mlp_only_layers
    # (and those decoder_sparse_step skips); () where every layer has experts.
    dense_layer_ids: tuple = ()
    dense_mlp_width: int = 0
    latent_attention: Optional["LatentAttention"] = None  # DeepSeek's MLA instead of Q/K/V projections
    head_norms: int = 0  # elements of per-head q/k RMSNorm weights per layer (Qwen3's q_norm, k_norm: 2 x head_dim)
    # tensor parallelism splits each routed expert like a dense MLP (Qwen2-MoE, Mixtral); DeepSeek-V2's
    # DeepseekV2MLP(is_moe=True) builds plain Linear layers: every tensor-parallel rank holds its experts whole
    experts_split_by_tensor_parallel: bool = True
    # DeepSeek-V3's multi-token-prediction (MTP) modules (``pretrain.mtp``), after the main model's layers: each
    # one more MoE decoder layer plus two RMSNorms and a [2 x hidden, hidden] projection; they share the main
    # model's embedding, final norm and output head
    prediction_layers: int = 0

    @property
    def dense_layers(self) -> int:
        """How many layers have a dense MLP (``dense_layer_ids``)."""
        return len(self.dense_layer_ids)

    @property
    def value_size(self) -> int:
        """Value heads x value head size: the width the attention output projection reads."""
        return self.latent_attention.value_size if self.latent_attention else self.query_size


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek-V2's multi-head latent attention (MLA; DeepSeek-V2 technical report, sec. 2.1), as paddlenlp's
    ``DeepseekV2Attention`` builds it: queries from ``q_proj`` [hidden, heads x (nope + rope)], or through the
    low rank ``q_a_proj`` [hidden, q_lora_rank] + RMSNorm + ``q_b_proj`` when ``q_lora_rank`` > 0; keys and values
    from ``kv_a_proj_with_mqa`` [hidden, kv_lora_rank + rope] (the latent and the shared RoPE key) + RMSNorm +
    ``kv_b_proj`` [kv_lora_rank, heads x (nope + v)]; ``o_proj`` [heads x v, hidden]; biases on q_a, kv_a and o
    with ``attention_bias``."""

    heads: int
    q_lora_rank: int  # 0: a full-rank q_proj (DeepSeek-V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    bias: bool

    @property
    def query_size(self) -> int:
        return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)

    @property
    def value_size(self) -> int:
        return self.heads * self.v_head_dim

    def parameters(self, hidden: int) -> int:
        """Elements of one layer's attention weights, norms and biases."""
        kv_a = self.kv_lora_rank + self.qk_rope_head_dim
        kv_b = self.heads * (self.qk_nope_head_dim + self.v_head_dim)
        if self.q_lora_rank:
            query = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.query_size
        else:
            query = hidden * self.query_size
        total = query + hidden * kv_a + self.kv_lora_rank + self.kv_lora_rank * kv_b + self.value_size * hidden
        biases = (self.q_lora_rank if self.q_lora_rank else 0) + kv_a + hidden
        return total + (biases if self.bias else 0)


@dataclass(frozen=True)
class Routing:
    """How a mixture-of-experts ``model_type`` routes tokens (``pretrain.routing`` reads it).

    ``router_suffix``: the name suffix of each MoE layer's router sublayer, whose input [..., hidden] times
    its ``weight`` [hidden, experts] (plus its ``bias``, if it has one) are the router logits.
    ``dropless``: why no token is dropped (the model's dispatch has no capacity limit), for the run summary.
    ``experts_key``, ``top_k_key``: the config keys of the routed experts per MoE layer and of the experts each
    token goes to, which the preflight names (``pretrain.preflight.check_experts``).
    ``init_routers``: paddlenlp leaves the router weights at a constant; a model built from scratch gets
    them drawn from normal(0, initializer_range) (``pretrain.compat.moe.init_routers``).
    ``no_expert_parallel``: why paddlenlp's model cannot spread its experts over ranks (empty: it can,
    through ``paddlenlp.transformers.moe_layer.MoELayer``; preflight refuses ``use_expert_parallel`` otherwise).
    ``skips_idle_experts``: where the block runs only the experts some token chose (why; empty: every expert
    runs each forward), which sharding stage3 cannot train (``layout_rules``: its per-layer collectives differ
    between ranks).
    ``aux_loss_coef_key``: the config key of the load-balancing loss's coefficient.
    ``aux_loss_in_model``: where the model adds its load-balancing loss itself (empty: it does not, and the
    trainer adds it); pretrain.routing then logs the model's own loss and adds nothing.
    ``topk_methods``: the ``topk_method`` values ``moe_gate.PretrainedMoEGate.topkgating`` has a branch for
    (DeepseekV2Config's default "gready" has none: ``UnboundLocalError``), which preflight requires.
    """

    router_suffix: str
    dropless: str
    experts_key: str
    top_k_key: str = "num_experts_per_tok"
    init_routers: bool = False
    no_expert_parallel: str = ""
    skips_idle_experts: str = ""
    aux_loss_coef_key: str = "router_aux_loss_coef"
    aux_loss_in_model: str = ""
    topk_methods: tuple = ()  # the config's topk_method values paddlenlp's gate computes (() : no such key)


@dataclass(frozen=True)
class WeightInit:
    """paddlenlp's ``_init_weights`` draws this type's weights other than its own code does, so a model built from
    scratch is drawn again (``pretrain.compat.weight_init.redraw``): every weight matrix from normal(0,
    initializer_range), those whose names end with one of ``depth_scaled`` (the residual output projections) with
    std initializer_range / sqrt(2 x num_hidden_layers), as GPT-2 and QWen scale them."""

    depth_scaled: tuple = ()


@dataclass(frozen=True)
class Implementation:
    """Everything this application knows about one paddlenlp ``model_type``: the one record every
    module reads (``pretrain.registry.implementation_for``), written in its ``pretrain/families/<type>.py``.

    The paddlenlp classes, then what the rest of the code reads of the model:

    - ``read_shape``: the ``DecoderShape`` of a config (parameter counts, FLOPs, the planner, LoRA shapes);
    - ``norm``: the planner's name for its norm kernel: "rms" (LLaMA, Qwen2), "rms_qwen" (QWen v1's
      RMSNorm keeps a float32 copy differently) or "layer" (GPT's LayerNorm);
    - ``recomputed_units``: ``{pipelined: {recompute_granularity: units recomputed}}`` (the Pipe models'
      decoder layers decide "full" themselves);
    - ``config_fixes``: set on every resolved config of this type (from the registry or a local
      config.json), because our data pipeline or paddlenlp's code paths need them;
    - ``fused_qkv_always``: one fused QKV projection whatever ``fuse_attention_qkv`` says (QWen v1's ``c_attn``);
    - ``rope_table_per_sample``: the unfused rotary embedding gathers a cos/sin table per sample
      ([micro_batch, s, 1, d] by position ids: LLaMA, Qwen2), else one [1, s, 1, d] table per micro-batch (QWen v1);
    - ``rope_cache_rows``: the rows of the float32 RoPE cos and sin tables ([1, rows, 1, rotary dim] each) that
      every attention layer keeps on the device (the planner's memory): ``ROPE_ROWS_SEQUENCE`` (paddlenlp's LLaMA,
      Qwen2, Qwen2-MoE and Mixtral rotary embeddings build them for max_position_embeddings positions, which
      ``pretrain.compat.rope_tables`` trims to the sequence; DeepSeek's build them on the host under
      ``device_guard("cpu")``, then on the device for the sequence at the first forward),
      ``ROPE_ROWS_TWICE_SEQUENCE`` (QWen v1's ``RotaryEmbedding.update_cos_sin_cache``: max(2 x sequence, 16)
      at the first forward), or None without RoPE (GPT's learned positions; an ALiBi config has none either);
    - ``dropout_keys``: config fields of dropout probabilities the model applies (GPT's hidden and attention dropout);
    - ``pipeline_head_saved_as_embedding``: the pipeline model names the last stage's copy of the tied output
      head as the embedding (GPT's ``GPTForCausalLMPipe``, gpt/modeling_pp.py:209), so a pipeline run's
      checkpoint holds no ``lm_head.weight``, which the model of every layout without pipelines expects;
    - ``vocab_replicated_when_indivisible``: the embedding and LM head fall back to a full copy on every
      tensor-parallel rank when the vocabulary does not divide (LlamaModel / Qwen2Model check it; GPT and
      QWen always split with ``mpu.VocabParallelEmbedding``, which asserts divisibility);
    - ``lora_layers``: the decoder layers' path under the causal LM for LoRA (paddlenlp's
      ``base_model_prefix`` + ".layers"), or None where LoRA targets are not known (``pretrain.finetune.lora``).

    - ``init_weights``: paddlenlp's ``_init_weights`` draws this type's weights wrongly (DeepSeek-V2: not at all;
      QWen v1: only tensor-parallel slices), so a model built from scratch is drawn again (``WeightInit``,
      ``pretrain.compat.weight_init``); None: paddlenlp's initialisation is the model's.
    - ``hf``: how the type is exported to and imported from Hugging Face transformers folders
      (``HFFormat``: pretrain.hf_export, pretrain.hf_import).
    - ``routing``: a mixture-of-experts type's routers (``Routing``: pretrain.routing).
    - ``compat``: installers (``apply`` of a ``pretrain.compat`` module) of fixes paddlenlp's classes of this
      type need before they load, save or convert weights; ``install_compat`` runs them (pretrain.model's
      ``build_model``, pretrain.hf_export and pretrain.hf_import, before they read the tensor-parallel mapping).

    Every field after the classes has a default or is keyword-only in use, so a new fact about model
    types is one new field with a default.
    """

    model_type: str
    config_class: type[Any]
    model_class: type[Any]
    pipe_class: Optional[type[Any]]  # used when pipeline_parallel_degree > 1; None: paddlenlp has none
    tokenizer_class: type[Any]
    read_shape: Callable[[PretrainedConfig], DecoderShape]
    norm: str
    recomputed_units: dict
    config_fixes: dict = field(default_factory=dict)
    fused_qkv_always: bool = False
    rope_table_per_sample: bool = True
    rope_cache_rows: Optional[str] = ROPE_ROWS_SEQUENCE
    dropout_keys: tuple = ()
    vocab_replicated_when_indivisible: bool = False
    pipeline_head_saved_as_embedding: bool = False
    lora_layers: Optional[str] = None
    # Attention mask forms (``pretrain.document_mask.MASK_FORMS``) the causal LM honours for
    # reset_attention_mask; () when it takes neither per-document positions nor a per-document mask.
    document_mask_forms: tuple = ()
    init_weights: Optional[WeightInit] = None
    hf: Optional[HFFormat] = None
    routing: Optional[Routing] = None  # mixture of experts: the routers (None: a dense model)
    compat: tuple = ()  # callables taking no argument: each installs one pretrain.compat fix (idempotent)

    def tokenizer_files(self) -> list:
        """Files a local tokenizer folder needs for this implementation's tokenizer class."""
        return ["tokenizer_config.json", *self.tokenizer_class.resource_files_names.values()]

    def fused_qkv(self, fuse_attention_qkv: bool) -> bool:
        """Whether the model runs one fused QKV projection under the ``fuse_attention_qkv`` flag."""
        return self.fused_qkv_always or bool(fuse_attention_qkv)

    def recomputed(self, pipelined: bool, granularity: str) -> tuple:
        """Units recomputed in backward with recompute on at ``recompute_granularity`` ``granularity``,
        with or without pipeline parallelism; () when that setting recomputes nothing."""
        return self.recomputed_units[pipelined].get(granularity, ())

    def install_compat(self) -> None:
        """Install the ``pretrain.compat`` fixes this type's paddlenlp classes need (``compat``; idempotent)."""
        for install in self.compat:
            install()


@dataclass(frozen=True)
class Family:
    """A published model family and its paddlenlp implementation."""

    name: str
    implementation: Implementation

    @property
    def model_type(self) -> str:
        return self.implementation.model_type

    def size(
        self,
        name: str,
        config: dict,
        published_params: Optional[float],
        source: str,
        aliases: tuple = (),
        published_active_params: Optional[float] = None,
    ) -> ModelSize:
        """One named size of this family (``ModelSize``'s fields, the family and implementation filled in)."""
        return ModelSize(
            name, self.name, self.implementation, config, published_params, source, aliases, published_active_params
        )


@dataclass(frozen=True)
class ModelSize:
    """One named size: paddlenlp config values and the published parameter count.

    ``config`` holds only what differs from the config class's defaults that matter to the
    architecture (layers, widths, heads, vocabulary, position scheme, norm epsilon, tying).
    """

    name: str
    family: str  # the Family's name
    implementation: Implementation = field(repr=False)  # the family's
    config: dict
    published_params: Optional[float]  # parameters as published; None for debug sizes
    source: str  # where the hyperparameters and the count come from
    aliases: tuple = ()
    published_active_params: Optional[float] = None  # mixture of experts: parameters a token uses, as published

    def model_config(self) -> PretrainedConfig:
        """A fresh paddlenlp config for this size (``config_fixes`` applied)."""
        impl = self.implementation
        return impl.config_class(**{"architectures": [impl.model_class.__name__], **self.config, **impl.config_fixes})


@dataclass(frozen=True)
class PublishedTokenizer:
    """The tokenizer a published architecture family was trained with, and what of it can be had offline."""

    models: str  # the architecture family as published
    prefixes: tuple  # registry architecture names it covers (prefix match, the longest matching prefix wins)
    tokenizer: str  # the published tokenizer
    tokenizer_class: str  # the paddlenlp class that loads it
    offline: str  # where its files come from without a model hub, or that they cannot be had
    folder: Optional[str] = None  # key of SOURCES that make tokenizers fetches for this family, if any
