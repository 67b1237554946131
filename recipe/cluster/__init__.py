"""Ray bootstrap for runs across several nodes.

Three ways a node of a run can meet Ray:

- ``single``: one node and no cluster given; verl's trainer starts its own local Ray.
- ``head`` / ``worker``: NNODES > 1 without KubeRay (``docker compose`` on each
  machine, or an indexed Kubernetes Job). NODE_RANK 0 starts a Ray head with
  ``ray start --head``; the others join it with ``ray start --address
  MASTER_ADDR:RAY_PORT``. The head waits until every node's devices are
  registered, then runs the trainer against that cluster; workers block while
  the head runs and leave once the head has been gone for a grace period.
- ``join-existing``: RAY_ADDRESS is set (KubeRay's RayJob runs the entrypoint as a
  Ray job on the head, where Ray sets RAY_ADDRESS): no node is started, the wait
  for the devices still runs, then the trainer joins that cluster.

Everything goes through Ray's own CLI (``ray start``) and API (``ray.init`` +
``ray.nodes()``). Functions take explicit arguments, not the settings object,
so they are tested with real Ray processes on loopback. Ray is imported
lazily: importing any of this costs nothing.

The rooms, each importing only those above it:

- ``rules``: what `plan` checks (hosts, GCS address, Ray auth, roles); pure, and all `plan` imports;
- ``ray_node``: the ``ray start`` argv and the RayNode process;
- ``readiness``: Ray's view of the nodes, assessed and waited for;
- ``shared_storage``: every node reads back a nonce in the checkpoint root before training;
- ``supervisors``: the head, worker and joined supervisors that `run` calls.
"""
