import os
import warnings

# Quiet megatron's "TE/apex not installed" warnings; the fallbacks are what CPU tests exercise.
warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
