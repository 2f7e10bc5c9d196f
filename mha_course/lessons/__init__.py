"""Helpers of single notebooks: the data, experiments and figures one lesson needs.

========================  ========  ===========================================================================
module                    notebook  what it holds
========================  ========  ===========================================================================
address_book              01        the address-book lookup: records, queries, bar charts
hand_set_heads            02        hand-set heads on the Xiaoming sentence, perturbation tests
head_budget               03        the head-budget explorer, FLOP counts of real modules
head_layout               04        where split_heads puts each feature; the wrong reshape; kernel traces
mask_lab                  05        mask conventions across APIs, the leakage test, the mask explorer
reorder_task              05        a cross-attention trained to reverse its source; the alignment it learns
decoding                  06        head groups, cache explorer, cached decoding step by step
relation_task             07        the two-relation address-book task
tiny_training             07        the tiny attention model and its training loop
head_ablation             07        removing and gating heads, attention mass, pruning curves
solve_rates               07        how sure a solve rate is: Wilson intervals, Fisher's exact test
pretrained                08        all-MiniLM-L6-v2 through the course's attention
efficient_attention       09        tile figures; the readable module made fast one change at a time
benchmark                 09        ``python -m mha_course.lessons.benchmark``: the library against PyTorch
diagnostics               10        per-head entropy, head similarity, NaN finder, causal leakage
symptoms                  10        the troubleshooting gallery: each symptom reproduced and fixed
positions_lab             11        shift/order experiments per position scheme, RoPE decoding bugs, SmolLM2 loader
beyond_gqa                12        cache-size tables, stacked windows, the tiny sink experiment, explorer
backward_pass             13        MHA's gradients by hand, backward FLOPs, training memory, dS on a real sentence
attention_across_devices  14        a first collective, head-layout and ring-schedule figures, traffic tables
modern_layers             15        tiny runs for QK-norm and the output gate, the soft-cap figure, tiny HF models
sparse_linear             16        decode costs, needle and recall tasks, the delta rule in transformers
========================  ========  ===========================================================================
"""
