// placeholder: trainer has no sources yet
namespace kiln {}
