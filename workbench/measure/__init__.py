"""Speed and sweeps: `latency` and `sweep` run the decoder (torch); latency_file.py and sweep_file.py own their CSVs
(no torch), so planning and the app read them without loading a model."""
