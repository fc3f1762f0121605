"""Lab 1 (article part 1): the generate loop. Write what `LLM.generate()` does with the engine.

`generate()` is `add_request` for each prompt, then `while has_unfinished_requests(): step()`, keeping each
request's finished RequestOutput. Time: about 20 minutes.
"""


def generate_loop(engine, prompts, params):
    """Run every prompt to completion on `engine`; return one finished RequestOutput per prompt, in prompt order.

    Inputs: engine, an LLMEngine with nothing running (next_request_id(), add_request(request_id, prompt,
    params), step() -> the RequestOutputs of that step, has_unfinished_requests()); prompts, a list of str;
    params, one SamplingParams for all of them.
    Output: a list, len(prompts) long, whose i-th element is the output of prompts[i] with .finished True.
    Invariants: when it returns, the engine has no unfinished request; it never calls step() once nothing is
    left; it holds for any finishing order and any number of steps a prefill takes (chunked prefill).
    Example: prompts ["A", "B"], B ends with EOS after 3 tokens and A runs 10: B's output finishes first,
    the result is still [A's output (10 tokens), B's output (3 tokens)].
    """
    ### BEGIN SOLUTION
    request_ids = []
    for prompt in prompts:
        request_id = engine.next_request_id()
        engine.add_request(request_id, prompt, params)
        request_ids.append(request_id)
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    return [finished[r] for r in request_ids]
    ### END SOLUTION
