import torch                      # torch_openreg autoloads; no import of it is needed
device = torch.device("openreg")
x = torch.tensor([[1., 2.], [3., 4.]], device=device)
y = x + 2
print(y, y.device)                # openreg:0
print(y.cpu())
