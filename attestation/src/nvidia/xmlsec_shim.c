/*
 * Enveloped XML-DSig verification of NVIDIA RIMs through libxmlsec1 (OpenSSL backend).
 * Canonicalisation, digests and the signature are all xmlsec's; this shim only wires the
 * signer key in (the caller has already verified the signer's chain at its own `now`) and
 * enforces that the one reference covers the whole document.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <libxml/parser.h>
#include <libxml/tree.h>
#include <xmlsec/xmlsec.h>
#include <xmlsec/xmltree.h>
#include <xmlsec/xmldsig.h>
#include <xmlsec/errors.h>
#include <xmlsec/crypto.h>

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_status = -1;

static void init_libraries(void) {
    xmlInitParser();
    if (xmlSecInit() < 0) return;
    if (xmlSecCheckVersion() != 1) return;
    xmlSecErrorsDefaultCallbackEnableOutput(0);
    if (xmlSecCryptoAppInit(NULL) < 0) return;
    if (xmlSecCryptoInit() < 0) return;
    init_status = 0;
}

static int fail(char *err, size_t err_len, const char *msg) {
    snprintf(err, err_len, "%s", msg);
    return -1;
}

int inferno_xmldsig_verify(const unsigned char *xml, size_t xml_len,
                           const unsigned char *cert_der, size_t cert_len,
                           char *err, size_t err_len) {
    int rc = -1;
    xmlDocPtr doc = NULL;
    xmlSecDSigCtxPtr ctx = NULL;
    xmlSecKeyPtr key = NULL;

    pthread_once(&init_once, init_libraries);
    if (init_status != 0) return fail(err, err_len, "libxmlsec1 initialisation failed");
    if (xml_len > (size_t)0x7fffffff || cert_len > (size_t)0x7fffffff)
        return fail(err, err_len, "input too large");

    doc = xmlReadMemory((const char *)xml, (int)xml_len, "rim.swidtag", NULL, XML_PARSE_NONET);
    if (doc == NULL) return fail(err, err_len, "XML parse error");
    xmlNodePtr root = xmlDocGetRootElement(doc);
    xmlNodePtr sig = root ? xmlSecFindNode(root, xmlSecNodeSignature, xmlSecDSigNs) : NULL;
    if (sig == NULL) { fail(err, err_len, "no ds:Signature element"); goto done; }
    if (sig->parent != root) { fail(err, err_len, "ds:Signature is not a child of the root"); goto done; }

    key = xmlSecCryptoAppKeyLoadMemory(cert_der, (xmlSecSize)cert_len, xmlSecKeyDataFormatCertDer,
                                       NULL, NULL, NULL);
    if (key == NULL) { fail(err, err_len, "cannot load the signer certificate key"); goto done; }
    ctx = xmlSecDSigCtxCreate(NULL);
    if (ctx == NULL) { fail(err, err_len, "cannot create the signature context"); goto done; }
    ctx->signKey = key;
    key = NULL; /* owned by ctx now */
    ctx->enabledReferenceUris = xmlSecTransformUriTypeEmpty;

    if (xmlSecDSigCtxVerify(ctx, sig) < 0) { fail(err, err_len, "signature processing failed"); goto done; }
    if (ctx->status != xmlSecDSigStatusSucceeded) { fail(err, err_len, "signature does not verify"); goto done; }
    if (xmlSecPtrListGetSize(&(ctx->signedInfoReferences)) != 1) {
        fail(err, err_len, "SignedInfo must hold exactly one reference"); goto done;
    }
    xmlSecDSigReferenceCtxPtr ref = (xmlSecDSigReferenceCtxPtr)xmlSecPtrListGetItem(&(ctx->signedInfoReferences), 0);
    if (ref == NULL || (ref->uri != NULL && ref->uri[0] != '\0')) {
        fail(err, err_len, "the reference does not cover the whole document"); goto done;
    }
    if (ref->status != xmlSecDSigStatusSucceeded) { fail(err, err_len, "reference digest mismatch"); goto done; }
    rc = 0;

done:
    if (key != NULL) xmlSecKeyDestroy(key);
    if (ctx != NULL) xmlSecDSigCtxDestroy(ctx);
    if (doc != NULL) xmlFreeDoc(doc);
    return rc;
}
