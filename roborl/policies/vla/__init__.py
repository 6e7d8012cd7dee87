"""Vision-language-action policies on `transformers` models (install the `vla` extra).

A SigLIP vision encoder and a causal language model form the backbone (`backbone.py`); two policy
families sit on it: `token_vla.TokenVLAPolicy` (OpenVLA-style discretized action tokens) and
`flow_vla.FlowVLAPolicy` (pi0-style flow-matching action expert). Importing this package is cheap:
`spec.py` is what `roborl.config` reads; the models import transformers only when used.
"""
