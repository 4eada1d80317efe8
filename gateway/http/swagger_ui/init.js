// Renders the OpenAPI document named by the #swagger-ui element's data-openapi
// attribute with the Swagger UI bundle loaded before this file. No validator badge (it
// would ask swagger.io), no request to any origin but the page's own.
"use strict";
(function () {
  var root = document.getElementById("swagger-ui");
  if (!root || typeof window.SwaggerUIBundle !== "function") {
    return;
  }
  window.ui = window.SwaggerUIBundle({
    url: root.getAttribute("data-openapi"),
    domNode: root,
    validatorUrl: null,
    deepLinking: true,
    docExpansion: "list",
    defaultModelsExpandDepth: 0,
  });
})();
