"""The adapters' tests against the environment packages themselves (reasoning-gym, TextArena, GEM): run where they
are installed, an environment of their own (``pip install -e ".[envpkgs]"``; .ci/run makes ``.venv-envpkgs-ci``),
since gem-llm pins reasoning-gym and NLTK, and openenv-core's gradio pins pillow, below what rayseq's main environment
has. Elsewhere each module is skipped."""
