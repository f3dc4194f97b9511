"""Training-framework integrations: tideflow's checkpoint guarantees for framework loops.

``tideflow.integrations.hf``  HF ``transformers.Trainer`` (``pip install 'tideflow[hf]'``)
``tideflow.integrations.lightning``  PyTorch Lightning 2.x (``pip install 'tideflow[lightning]'``)

Each module imports its framework; this package imports neither, so importing
``tideflow`` never pulls in transformers or lightning.
"""
