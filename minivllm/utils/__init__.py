"""Mirror of vllm/utils/: small helpers shared by the engine, the command line and examples."""
from minivllm.utils.argparse_utils import FlexibleArgumentParser
from minivllm.utils.math_utils import cdiv

__all__ = ["FlexibleArgumentParser", "cdiv"]
