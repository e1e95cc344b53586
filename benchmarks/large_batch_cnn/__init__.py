"""LENA's paper Tables 1-3 and ablations on MNIST-1D with the example's 8-leaf CNN."""
