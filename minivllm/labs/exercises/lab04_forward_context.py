"""Lab 4 (article part 4): the forward context. Write get_attention_context, what one Attention layer pulls.

The model's forward takes only (input_ids, positions); the step's attention metadata and slot_mapping reach
each layer through the forward context the runner installs (set_forward_context). A layer asks for its own
entries by its layer_name: the shared metadata, the layer object, that layer's KV cache and its slot_mapping.
Time: about 20 minutes.
"""
from minivllm.forward_context import get_forward_context


def get_attention_context(layer_name):
    """Return (attn_metadata, layer, kv_cache, slot_mapping) for the Attention layer named layer_name.

    Inputs: layer_name, a str such as "model.layers.3.self_attn.attn"; the context comes from
    get_forward_context() (raises if no forward is running), with fields no_compile_layers (dict: layer name
    -> the layer object, whose .kv_cache the runner bound), attn_metadata (one object for the whole step,
    shared by every layer) and slot_mapping (dict: layer name -> an int64 tensor [num_tokens]).
    Output: a 4-tuple (the step's attn_metadata, the named layer, that layer's .kv_cache, the slot_mapping
    entry of that layer, or None when the context has none for it).
    Invariants: the very objects of the context are returned (`is`-identical: no copy, no new tensor), so the
    layer writes into the cache the runner reads; another layer's name gives another layer and its own cache;
    nothing in the context is changed.
    Example: inside set_forward_context(md, {"layers.0.attn": L0, "layers.1.attn": L1},
    slot_mapping={"layers.0.attn": s0, "layers.1.attn": s1}) with s1 = tensor([8, 9, 10]),
    get_attention_context("layers.1.attn") -> (md, L1, L1.kv_cache, s1): its slot_mapping is [8, 9, 10],
    and each of the four `is` the context's own object.
    """
    ### BEGIN SOLUTION
    forward_context = get_forward_context()
    layer = forward_context.no_compile_layers[layer_name]
    return forward_context.attn_metadata, layer, layer.kv_cache, forward_context.slot_mapping.get(layer_name)
    ### END SOLUTION
