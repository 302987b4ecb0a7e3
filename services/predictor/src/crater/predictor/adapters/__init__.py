"""The predictor's adapters: its tables and the store of observed peaks and corrections."""
