"""What ships inside every merged export, as ``custom_generate/``: skip decoding for plain transformers.

The export writer copies each module of this package byte for byte into the export's ``custom_generate/`` folder,
where transformers (>= 5.24) loads ``generate.py`` and, through their relative imports, its siblings. So the package
imports nothing of skiptrain (an import-linter contract keeps it so): only the standard library, torch and
transformers. skiptrain itself imports it from here: the front-ends, the export format and the vLLM plugin.
"""
