"""Lightning callbacks of skiptrain, installed as ``skiptrain.callbacks``."""
