"""Shared command-line plumbing: user errors become one `error:` line and exit status 2."""
from __future__ import annotations

import json
import logging
import sys
import warnings
from typing import Callable

from mlmclm.convert.dist_reader import CheckpointReadError
from mlmclm.convert.hf_config import UnsupportedModelError
from mlmclm.convert.hf_source import SourceError
from mlmclm.convert.output import OutputExistsError
from mlmclm.convert.verify import VerificationError
from mlmclm.redact import install_log_redaction, redact
from mlmclm.train.checkpoint_files import CheckpointError
from mlmclm.train.checkpoint_guard import UnsafeCheckpointError

USER_ERRORS = (CheckpointError, CheckpointReadError, UnsafeCheckpointError, UnsupportedModelError, SourceError,
               OutputExistsError, VerificationError, ValueError, FileNotFoundError, NotADirectoryError,
               json.JSONDecodeError)


def run_cli(main: Callable[[], str]) -> int:
    """Run `main` (returns the summary text); print it, or the error that stopped it, and return the status."""
    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*")
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    install_log_redaction()
    try:
        print(main())
    except USER_ERRORS as err:
        print(redact(f"error: {err}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the output directory was not written", file=sys.stderr)
        return 130
    except OSError as err:  # the filesystem's refusal (a full disk, an unreadable file): the OS's words, and the
        # file when the error names one (a failed write often does not)
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err} (nothing was published: the output directory is written only "
              f"when everything succeeded)", file=sys.stderr)
        return 1
    return 0
