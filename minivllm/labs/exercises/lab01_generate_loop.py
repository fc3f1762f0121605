"""Lab 1 (article part 1): the generate loop. Write what `LLM.generate()` does with the engine.

`generate()` is `add_request` for each prompt, then `while has_unfinished_requests(): step()`, keeping each
request's finished RequestOutput. Time: about 20 minutes.
"""


def generate_loop(engine, prompts, params):
    """Drive `engine` (an LLMEngine) until every prompt finished; return the finished RequestOutputs in prompt order.

    engine.next_request_id() gives a fresh id; engine.add_request(request_id, prompt, params) submits one;
    engine.step() returns RequestOutputs (output.finished is True once a request is done).
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
