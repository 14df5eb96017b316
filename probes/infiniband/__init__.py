"""InfiniBand and RoCE ports of non-EFA RDMA devices (mlx5, mlx4, hfi1, irdma, ...)."""
