"""``python -m vgpumon`` runs the same CLI as the ``vgpumon`` console script."""

from vgpumon.launch import main

if __name__ == "__main__":
    main()
