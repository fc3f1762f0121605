"""Mirror of vllm/utils/: small helpers shared by the command line and examples."""
from minivllm.utils.argparse_utils import FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser"]
