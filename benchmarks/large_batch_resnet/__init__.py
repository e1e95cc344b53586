"""Large-batch study of a deep BatchNorm network (ResNet1D on MNIST-1D): when does LENA's
layer-wise scaling win, lose or tie; tuned LARS/LAMB; LENA's warm-up variants."""
