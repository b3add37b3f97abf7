"""`strop ui`: a web app over the store and the run folders, served by strop itself (no CDN, no internet).

    server  the HTTP server: the page, its scripts (static/, shipped in the wheel) and the guards
    api     the JSON endpoints the page polls (runs, a run's metrics, log, rollouts; cancel and resume)
    rollouts  pages of rollouts.jsonl through a byte-offset index, never the whole file

    strop ui --port 8765            # then open http://127.0.0.1:8765/

Model outputs, tool results and grader messages are shown as text (the scripts set textContent, never HTML).
"""
