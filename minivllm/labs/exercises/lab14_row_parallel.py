"""Lab 14 (tensor parallelism): the row-parallel linear layer. Write RowParallelLinear's weight_loader,
local_bias and forward.

Under tensor parallelism over tp_size ranks, o_proj and down_proj are row-parallel: Y = X W^T with W
[output_size, input_size] cut along its input dimension. Rank r holds the columns r*n/tp ... (r+1)*n/tp of W
(n = input_size) and receives the matching slice of X (the heads or MLP units it computed itself); its
product is a partial sum of Y, and an all-reduce adds the ranks' partial sums. Time: about 30 minutes.
"""
from minivllm.distributed.communication_op import tensor_model_parallel_all_reduce
from minivllm.models.linear import default_weight_loader


def weight_loader(self, param, loaded_weight, shard_id=None):
    """Copy this rank's part of the checkpoint's full tensor into `param`.

    Inputs: self (tp_rank, tp_size); param: self.weight [output_size, input_size / tp_size] or self.bias
    [output_size]; loaded_weight: the checkpoint's whole tensor ([output_size, input_size], or the bias).
    Rules: the weight's slice is the tp_rank-th of tp_size equal slices along the input dimension (dim 1);
    the bias is whole on every rank. Copy with default_weight_loader(param, tensor) (it checks the shapes).
    Example: tp_size 2, W [4, 6]: rank 0 gets W[:, 0:3], rank 1 W[:, 3:6].
    """
    ### BEGIN SOLUTION
    if param.dim() == 1:
        return default_weight_loader(param, loaded_weight)
    size = param.shape[1]
    default_weight_loader(param, loaded_weight.narrow(1, self.tp_rank * size, size))
    ### END SOLUTION


def local_bias(self):
    """Return the bias this rank adds in its own product (self.matmul adds it), or None.

    Inputs: self.bias ([output_size] or None: no bias), self.tp_rank, self.tp_size.
    Invariants: the partial outputs are summed over the ranks, so a bias added by every rank would count
    tp_size times: exactly one rank, rank 0, adds self.bias; the others add nothing.
    Example: tp_size 2, bias b: rank 0 -> b, rank 1 -> None; tp_size 1 -> b.
    """
    ### BEGIN SOLUTION
    return self.bias if self.tp_rank == 0 else None
    ### END SOLUTION


def forward(self, x):
    """Return (output, None): Y for this layer, the same full [num_tokens, output_size] tensor on every rank.

    Inputs: x [num_tokens, input_size / tp_size], this rank's slice of the layer's input. self.matmul(x)
    gives this rank's product with its shard (packed on the CPU) plus local_bias(): a partial sum of Y.
    Rules: sum the partial sums over the ranks with tensor_model_parallel_all_reduce(tensor) (every rank
    calls it, with its own partial sum); skip it when self.reduce_results is False (the caller sums) or
    tp_size == 1.
    Invariants: sum over r of x_r W_r^T = X W^T; the bias counted once.
    Example: tp_size 2, x_0 = [[1, 2]], x_1 = [[3, 4]], W = [[1, 1, 1, 1]], bias [10]: rank 0's
    partial is [[13]], rank 1's [[7]]; both return [[20]].
    """
    ### BEGIN SOLUTION
    output = self.matmul(x)
    if self.reduce_results and self.tp_size > 1:
        output = tensor_model_parallel_all_reduce(output)
    return output, None
    ### END SOLUTION
