"""The article's figures, drawn with matplotlib from traced runs of the real engine (outside the minivllm package).

`python -m plots --out figures` (`make figures`) reruns the notebooks' engine runs (`runs.py`) and writes one
PNG per module: fig2_process_boundary ... fig8_sampling_and_release, timeline. Each module's `draw` takes a
Trace (fig5: the article's packed batch) and returns a `matplotlib.figure.Figure`; only layout coordinates are
typed in, every number, label and arrow comes from the trace. Nothing here touches matplotlib's global
backend or pyplot. Left out: anything the trace does not record (timings, tensor values beyond ids and
indices); the swap half of fig4 is a sketch, since vLLM V1 never swaps on this path.
"""
