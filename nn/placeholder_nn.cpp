// placeholder: nn has no sources yet
namespace kiln {}
