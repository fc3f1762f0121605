"""Lab 4 (article part 4): the forward context. Write get_attention_context, what one Attention layer pulls.

The model's forward takes only (input_ids, positions); the step's attention metadata and slot_mapping reach
each layer through the forward context the runner installs (set_forward_context). A layer asks for its own
entries by its layer_name: the shared metadata, the layer object, that layer's KV cache and its slot_mapping.
Time: about 20 minutes.
"""
from minivllm.forward_context import get_forward_context


def get_attention_context(layer_name):
    """Return (attn_metadata, layer, kv_cache, slot_mapping) for the Attention layer named layer_name.

    All from get_forward_context(): its no_compile_layers (layer_name -> layer, whose .kv_cache the runner bound),
    attn_metadata (shared by every layer) and slot_mapping (layer_name -> tensor).
    """
    ### BEGIN SOLUTION
    forward_context = get_forward_context()
    layer = forward_context.no_compile_layers[layer_name]
    return forward_context.attn_metadata, layer, layer.kv_cache, forward_context.slot_mapping.get(layer_name)
    ### END SOLUTION
