// placeholder: data has no sources yet
namespace kiln {}
