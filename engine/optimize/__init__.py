"""`engine optimize MODEL --device D --precision P`: the one-line path. It reads what the model is,
writes the workflow that optimizes it for the device (an ordinary workflow: validated, cached,
searched and measured like any other), shows and saves it, and runs it as `engine run` does.

``args`` holds the command's options (light, read on every start of the CLI), ``model`` finds and
reads the model, ``pipelines`` makes the workflow, ``command`` checks, shows and saves it."""
