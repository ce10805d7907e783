"""Model packaging: turn a pinned GGUF file into the `model.tar.gz` that SageMaker endpoints load.

The package owns everything between "a pin in `pins.json`" and "an archive in S3": resolving the pin to a
download URL, a resumable verified download, the pin's calibration file, the manifest, the archive and the
upload. Run it as `python -m model_build`; `model_build/README.md` describes the commands, the archive layout
and the exit codes.
"""

__version__ = "0.2.0"
