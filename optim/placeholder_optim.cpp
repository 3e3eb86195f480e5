// placeholder: optim has no sources yet
namespace kiln {}
