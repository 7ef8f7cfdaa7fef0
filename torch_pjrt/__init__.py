"""torch-pjrt: a native PyTorch device for every PJRT accelerator."""
