"""Protobuf and gRPC modules for the kubelet pod-resources API (v1), generated from ``api.proto``.

Importing ``api_pb2_grpc`` needs the ``kubernetes`` extra (grpcio, protobuf); nothing here is
imported unless the kubelet socket exists (``vgpumon.sources.kubernetes``). Regenerate with
``regenerate.sh``.
"""
