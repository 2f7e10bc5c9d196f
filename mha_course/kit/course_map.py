"""The course at a glance: the notebook map, the notation, and the English–Chinese glossary.

One source for README.md, notebook 00 and the tests (which check that README.md agrees).
"""

from __future__ import annotations

from ..i18n import tr, translate

#: (file stem, title, one line on what it shows)
NOTEBOOKS: list[tuple[str, str, str]] = [
    (
        "00_setup_check",
        "Setup check",
        "Is your environment ready? How exercises and checkers work; notation; glossary.",
    ),
    (
        "01_single_head_attention",
        "Single-head attention",
        "Q/K/V as a soft dictionary lookup (the address book); why divide by √d_k; "
        "what if one query asks two questions?",
    ),
    (
        "02_multi_head_attention",
        "Multi-head attention",
        "Two questions → two heads; which tokens does each head read? The looped implementation = PyTorch's.",
    ),
    (
        "03_parameter_and_compute_accounting",
        "Parameters and compute",
        "Parameters, FLOPs and memory counted as h changes; real models from their configs.",
    ),
    (
        "04_batched_implementation",
        "The batched implementation",
        "h small matrices = one big one; which reshape splits the heads? nn.MultiheadAttention interop.",
    ),
    (
        "05_masks_and_cross_attention",
        "Masks and cross-attention",
        "Padding and causal masks across APIs; a row with no allowed key; leakage test; encoder–decoder attention.",
    ),
    (
        "06_gqa_mqa_and_kv_cache",
        "GQA, MQA and the KV cache",
        "Sharing K/V heads (Llama 3 8B); cache bytes = formula; cached decoding = full recomputation.",
    ),
    (
        "07_do_heads_specialize",
        "Do heads specialise?",
        "Tiny models trained on a CPU: one head vs several on a two-relation task; ablation and pruning.",
    ),
    (
        "08_heads_in_a_pretrained_model",
        "Heads in a pretrained model",
        "all-MiniLM-L6-v2 run through the course's attention; its heads visualised and ablated.",
    ),
    (
        "09_efficient_attention",
        "Efficient attention",
        "The L² score matrix; tiling with an online softmax (the FlashAttention idea); SDPA; benchmarks.",
    ),
    (
        "10_transformer_block",
        "The transformer block",
        "An encoder block = nn.TransformerEncoderLayer; pre-norm vs post-norm measured; "
        "what does a block make of word order?",
    ),
    (
        "11_positions_and_rope",
        "Positions and RoPE",
        "Learned, sinusoidal, ALiBi and RoPE under one test; RoPE's layouts and the KV cache; "
        "a Llama decoder = transformers' LlamaForCausalLM.",
    ),
    (
        "12_beyond_gqa",
        "Beyond GQA",
        "Latent attention (DeepSeek), sliding windows with sinks, paged and int8 caches — each proven and measured.",
    ),
    (
        "13_backward_pass",
        "The backward pass",
        "Attention's gradients by hand, = autograd; FlashAttention-2's backward recomputes P from the log-sum-exp.",
    ),
    (
        "14_attention_across_devices",
        "Attention across devices",
        "Real gloo ranks on a CPU: heads split by tensor parallelism, ring attention, Ulysses — each = one process.",
    ),
    (
        "15_modern_attention_layers",
        "Modern attention layers",
        "QK-norm, Gemma 2's soft-cap and Qwen3-Next's output gate, each measured on a tiny model; "
        "five families' layers loaded and proven.",
    ),
    (
        "16_sparse_and_linear_attention",
        "Attention that skips keys",
        "Top-k sparse attention with an indexer (= DeepSeek-V3.2); linear attention, the delta rule and "
        "Gated DeltaNet (= Qwen3-Next); associative recall measured; hybrid caches.",
    ),
    (
        "17_debugging_attention",
        "Debugging attention",
        "The closing clinic: uniform, collapsed and identical heads, NaN, leaking masks — caused, diagnosed, fixed.",
    ),
]

#: (symbol, meaning) — used identically in every notebook and in the package
NOTATION: list[tuple[str, str]] = [
    ("B", "batch size"),
    ("L, Lq, Lk", "sequence length; query length; key/value length"),
    ("d_model (d)", "model width: the size of each token's vector"),
    ("h = num_heads", "number of (query) heads"),
    ("h_kv = num_kv_heads", "number of key/value heads (h: MHA, 1: MQA, in between: GQA)"),
    (
        "d_head = d_model // h",
        "width of one head (d_k = d_v = d_head in multi-head attention); spelled `head_dim` only where the "
        "course mirrors a Hugging Face config or checkpoint (GroupedQueryAttention, ModelConfig, the "
        "decoder), like q_proj, k_proj, v_proj, o_proj there",
    ),
    ("d_k, d_v", "width of queries/keys and of values in single-head attention"),
    ("Q, K, V", "queries (B, h, Lq, d_head), keys (B, h, Lk, d_head), values (B, h, Lk, d_head)"),
    ("W_Q, W_K, W_V, W_O", "projection matrices; head i owns column block i of W_Q, W_K, W_V"),
    ("mask", "bool, True = may attend (the course's convention), broadcast to (B, h, Lq, Lk)"),
]

#: (English, 中文, one-line meaning)
GLOSSARY: list[tuple[str, str, str]] = [
    ("attention", "注意力", "a weighted average of values, weighted by how well keys match a query"),
    ("self-attention", "自注意力", "queries, keys and values all come from the same sequence"),
    ("multi-head attention", "多头注意力", "several attentions in parallel, each with its own projections"),
    ("attention head", "注意力头", "one of those parallel attentions (its own W_Q, W_K, W_V)"),
    ("query / key / value", "查询 / 键 / 值", "what a position asks / how it can be found / what it hands over"),
    ("scaled dot-product attention", "缩放点积注意力", "softmax(QKᵀ/√d_k)V"),
    ("attention weights", "注意力权重", "the softmax output: each row sums to 1"),
    ("softmax", "softmax（归一化指数函数）", "turns scores into positive weights that sum to 1"),
    ("mask", "掩码", "which query–key pairs may attend"),
    ("may attend", "可以关注", "a mask's True: the query may read that key"),
    ("padding mask", "填充掩码", "hides padding tokens added to make sequences the same length"),
    ("causal mask", "因果掩码", "hides the future: position i sees only positions ≤ i"),
    ("cross-attention", "交叉注意力", "queries from one sequence, keys/values from another"),
    ("encoder / decoder", "编码器 / 解码器", "the two stacks of the original Transformer"),
    ("projection", "投影", "a linear map (a weight matrix) applied to every token"),
    ("concatenation", "拼接", "joining the heads' outputs side by side"),
    ("output projection", "输出投影", "W_O: mixes the concatenated heads back to d_model"),
    ("grouped-query attention (GQA)", "分组查询注意力", "groups of query heads share one key/value head"),
    ("multi-query attention (MQA)", "多查询注意力", "all query heads share a single key/value head"),
    ("KV cache", "键值缓存", "keys and values of past tokens kept during generation"),
    ("positional encoding", "位置编码", "what tells attention where each token is"),
    ("residual connection", "残差连接", "adding a block's input to its output"),
    ("layer normalisation", "层归一化", "LayerNorm: normalises each token's vector"),
    ("feed-forward network", "前馈网络", "the per-token MLP of a transformer block"),
    ("parameters", "参数量", "the number of learned numbers"),
    ("FLOPs", "浮点运算次数", "floating-point operations (a multiply-add counts 2)"),
    ("token", "词元", "one unit of text the model reads: a word or a piece of one"),
    ("embedding", "嵌入", "the learned vector that stands for a token"),
    ("logits", "logits（未归一化分数）", "scores before the softmax"),
    ("entropy", "熵", "how spread out a row of attention weights is"),
    (
        "rotary position embedding (RoPE)",
        "旋转位置编码",
        "rotates queries and keys by an angle that grows with position",
    ),
    ("sinusoidal positional encoding", "正弦位置编码", "the original Transformer's fixed sine and cosine positions"),
    ("extrapolation", "外推", "running a model on sequences longer than it was trained on"),
    ("position interpolation", "位置插值", "squeezing long positions into the trained range"),
    ("sliding-window attention", "滑动窗口注意力", "each query sees only the last W keys"),
    ("attention sink", "注意力汇聚点", "a token that collects weight no query needs elsewhere"),
    (
        "multi-head latent attention (MLA)",
        "多头潜在注意力",
        "caches one small latent vector per token instead of K and V",
    ),
    ("sparse attention", "稀疏注意力", "each query reads only a chosen subset of the keys"),
    ("linear attention", "线性注意力", "attention without the softmax, a state updated token by token"),
    ("delta rule", "delta 规则", "a state update that corrects what the state already stores"),
    ("gate", "门控", "a learned factor in [0, 1] that scales a signal"),
    ("QK-norm", "QK 归一化", "normalising queries and keys before their dot product"),
    ("soft-capping", "软封顶", "squashing scores smoothly into (−c, c) with c·tanh(s/c)"),
    ("ablation", "消融", "removing a part (a head) to see what it did"),
    ("pretrained model", "预训练模型", "a model whose weights were learned on a large corpus"),
    ("prefill / decode", "预填充 / 解码", "reading the prompt at once / generating one token at a time"),
    ("memory bandwidth", "内存带宽", "bytes per second the memory delivers"),
    ("backward pass", "反向传播", "computing the gradients, from the loss back to the inputs"),
    ("gradient", "梯度", "how the loss changes with each number"),
    ("online softmax", "在线 softmax", "a softmax computed block by block with a running maximum"),
    ("tile", "分块", "a block of queries or keys processed at once"),
    ("recomputation", "重计算", "computing an intermediate again in the backward instead of storing it"),
    ("activation checkpointing", "激活检查点", "storing few activations and recomputing the rest"),
    ("data parallelism", "数据并行", "each device a different batch, the same weights"),
    ("tensor parallelism", "张量并行", "the heads (and weights) split across devices"),
    ("context parallelism", "上下文并行", "the sequence split across devices"),
    ("sequence parallelism", "序列并行", "Megatron's sharding of the norm and dropout activations along the sequence"),
    ("ring attention", "环形注意力", "key/value blocks passed around a ring of devices"),
    ("rank", "rank（进程编号）", "one process of a distributed job"),
    ("all-reduce", "all-reduce（全归约）", "every rank ends with the sum of all ranks' tensors"),
    ("all-gather", "all-gather（全收集）", "every rank ends with every rank's tensor"),
    ("all-to-all", "all-to-all（全交换）", "every rank sends a different piece to every other rank"),
    ("checker", "检查器", "the function that tests an exercise and names a likely mistake"),
    ("exercise", "练习", "code the learner writes, checked by a checker"),
    ("hint ladder", "提示阶梯", "hints from gentle to specific, one rung at a time"),
    ("deep dive", "深入探讨", "an optional section beyond the core path"),
    ("student edition", "学生版", "the notebooks with the exercises left for the learner"),
]


def _table(header: tuple[str, ...], rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def glossary_markdown() -> str:
    """The glossary as a Markdown table (English | 中文 | meaning; the meaning in the course's language)."""
    rows = ((en, zh, translate(meaning, f"glossary {en}")) for en, zh, meaning in GLOSSARY)
    return _table(("English", "中文", tr("meaning", "table header")), rows)


def notation_markdown() -> str:
    """The notation as a Markdown table."""
    rows = ((f"`{s}`", translate(m, f"notation {s}")) for s, m in NOTATION)
    return _table((tr("symbol", "table header"), tr("meaning", "table header")), rows)


def course_map_markdown(
    *,
    colab_base: str | None = None,
    existing: set[str] | None = None,
    student: set[str] | None = None,
    folder: str = "",
) -> str:
    """The course map as a Markdown table; with ``colab_base`` (…/blob/main/) a Colab link per row;
    with ``student`` (the stems that have a student edition in notebooks/student/) a column with
    the student edition's links. ``folder`` is the way from where the table is shown to the
    notebooks: "" in a notebook, "notebooks/" in README.md."""
    badge = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
    rows = []
    for stem, title, line in NOTEBOOKS:
        if existing is not None and stem not in existing:
            continue
        link = f"[{stem}]({folder}{stem}.ipynb)"
        colab = f" {badge}({colab_base}notebooks/{stem}.ipynb)" if colab_base else ""
        title, line = translate(title, f"course map {stem} title"), translate(line, f"course map {stem} line")
        row = (stem[:2], f"**{title}**", line, link + colab)
        if student:
            if stem in student:
                colab = f" {badge}({colab_base}notebooks/student/{stem}.ipynb)" if colab_base else ""
                row += (f"[student]({folder}student/{stem}.ipynb){colab}",)
            else:
                row += ("—",)
        rows.append(row)
    header = ("#", tr("notebook", "table header"), tr("what you will see", "table header"), tr("open", "table header"))
    if student:
        header = header[:3] + (
            tr("solved edition", "table header"),
            tr("student edition (exercises to fill in)", "table header"),
        )
    return _table(header, rows)
