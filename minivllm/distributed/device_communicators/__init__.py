"""Mirror of vllm/distributed/device_communicators/: how a group's tensors travel beyond torch.distributed's own
collectives. minivllm has the CPU's one (cpu_communicator.py, shared memory between ranks on one machine)."""
